"""Session 37, probe C: the large-batch path's bookkeeping with fewer transitions (engine.core.steady_decodes).

- A due row whose event is a block (opened or filled) stays steady: the scheduler takes its block and files it under
  its next event (``SteadyDecodes.decoded_in_place``); it is no special row, and postprocess does not see it.
- A debt is the log's last ``key + advance - num_computed_tokens`` entries: no position is kept per sequence.
- A row a quiet window handled is filed afresh by ``skipped`` from its state (its key unchanged).
- sim.runner sums a short quiet segment's step prices in its own loop: the same floats as one step at a time."""

from __future__ import annotations

from array import array

from engine.core.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceStatus
from engine.core.steady_decodes import SteadyDecodes


def _filed_batch(caching: bool) -> tuple[Scheduler, list[Sequence]]:
    """Three sequences of 5, 6 and 7 prompt tokens in 16-token blocks, decoding on the path (one row on), filed."""
    config = EngineConfig(block_size=16, enable_prefix_caching=caching).resolved(num_gpu_blocks=100,
                                                                                 max_model_len=512)
    scheduler = Scheduler(config, lazy_tokens=True)
    scheduler.min_steady_rows = 1
    seqs = [Sequence(i, list(range(8, 13 + i)), SamplingParams(max_tokens=40)) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    for now_s in (0.0, 1.0):  # the prompts, then a step row by row that files them
        batch = scheduler.schedule(now_s)
        scheduler.postprocess(batch, [9] * 3, now_s + 1.0)
    return scheduler, seqs


def test_a_block_event_row_stays_steady_and_is_no_special_row():
    """Without prefix caching a row's block events are opening blocks: its second at 16 computed tokens, which the
    rows of 6, 7 and 8 computed tokens (advance 0) reach at advances 10, 9 and 8. There the scheduler allocates the
    block (its debt paid first) and files the row under its third block, 16 steps on (its finish, 45 + i tokens, is
    later); no row of those steps is special, and every row owes its tokens from there on."""
    scheduler, seqs = _filed_batch(caching=False)
    steady = scheduler.steady_decodes
    assert steady.advance == 0 and list(steady.steady.values()) == [10, 9, 8]
    used = scheduler.block_manager.num_used_blocks
    for step in range(11):
        batch = scheduler.schedule(2.0 + step)
        assert batch.special_rows == [] and batch.num_decode_seqs == 3
        scheduler.postprocess(batch, [9] * 3, 3.0 + step)
        if step == 8:  # the step of advance 8 took the third row's block
            assert scheduler.block_manager.num_used_blocks == used + 1
            assert [len(seq.block_table) for seq in seqs] == [1, 1, 2]
    assert scheduler.block_manager.num_used_blocks == used + 3
    assert [steady.steady[seq] for seq in seqs] == [26, 25, 24]
    assert [len(seq.token_ids) for seq in seqs] == [17, 17, 17]  # paid at 16 computed, owed since
    scheduler.settle_tokens()
    assert [seq.num_computed_tokens for seq in seqs] == [17, 18, 19]
    assert [len(seq.token_ids) for seq in seqs] == [18, 19, 20]
    assert [list(seq.token_times_s) for seq in seqs] == [[1.0, 2.0] + [3.0 + k for k in range(11)]] * 3


def test_a_filled_block_registers_its_owed_tokens():
    """With prefix caching a row filling its first block is due there: its debt paid, the block registered (hashed
    from the tokens owed until then), and the row stays steady, filed the next step (which opens its second block)."""
    scheduler, seqs = _filed_batch(caching=True)
    steady = scheduler.steady_decodes
    # The first block fills with the 16th token: computed 15 -> 16, at advances 9, 8 and 7.
    assert list(steady.steady.values()) == [9, 8, 7]
    for step in range(8):
        batch = scheduler.schedule(2.0 + step)
        assert batch.special_rows == []
        scheduler.postprocess(batch, [9] * 3, 3.0 + step)
    third = seqs[2]
    assert third.num_registered_blocks == 1 and steady.steady[third] == 8  # its new block: the very next step
    assert len(third.block_hashes) == 1 and len(third.token_ids) == 16  # paid at the fill (15 computed + its token)
    batch = scheduler.schedule(10.0)
    assert batch.special_rows == [] and len(third.block_table) == 2


def test_a_debt_is_read_off_the_key():
    """Two sequences filed two steps apart owe the log's last entries from their own step on; a row whose count runs
    ahead of the advance (a quiet window gave it its tokens) owes nothing; settle_all pays each once."""
    steady = SteadyDecodes(16, False, lazy=True)
    seqs = []
    for i, computed in enumerate((40, 70)):
        seq = Sequence(i, list(range(8, 8 + computed + 1)), SamplingParams(max_tokens=200))
        seq.num_computed_tokens = computed
        seq.block_table = [0, 1, 2, 3, 4]
        seq.status = SequenceStatus.RUNNING
        seq.first_token_s = 0.5
        seqs.append(seq)
    steady.file(seqs[0])
    for now_s in (1.0, 2.0):
        steady.advance += 1
        steady.log_step(7, now_s)
    steady.file(seqs[1])
    steady.advance += 1
    steady.log_step(9, 3.0)
    assert steady._keys[seqs[0]] == 40 and steady._keys[seqs[1]] == 70 - 2
    steady.settle(seqs[1])
    assert (seqs[1].num_computed_tokens, list(seqs[1].token_ids[-2:]), list(seqs[1].token_times_s)) == \
        (71, [78, 9], [3.0])
    steady.settle(seqs[1])  # paid: nothing more
    assert seqs[1].num_computed_tokens == 71
    seqs[0].num_computed_tokens += 5  # ahead of the advance: owes nothing, however far
    steady.settle(seqs[0])
    assert seqs[0].num_computed_tokens == 45 and len(seqs[0].token_ids) == 41
    seqs[0].num_computed_tokens -= 5
    steady.settle_all()
    assert (seqs[0].num_computed_tokens, list(seqs[0].token_ids[-3:]), list(seqs[0].token_times_s)) == \
        (43, [7, 7, 9], [1.0, 2.0, 3.0])
    assert len(steady._log_times) == 0 and steady.plain_context() == (43 + 71, 71)


def test_skipped_files_a_handled_row_afresh():
    """A window of 4 steps that handled a row filed under its last step: the row, given its tokens and block by the
    window, is filed under its next event from the advance after the window, its key kept."""
    steady = SteadyDecodes(16, False, lazy=True)
    seq = Sequence(0, list(range(8, 8 + 14)), SamplingParams(max_tokens=100))
    seq.num_computed_tokens = 13
    seq.block_table = [0]
    seq.status = SequenceStatus.RUNNING
    seq.first_token_s = 0.5
    steady.file(seq)
    assert steady.steady[seq] == 3  # its block opens at 16 computed
    # The window's steps, applied as engine.core.quiet_window applies them: three tokens, a second block.
    seq.token_ids.extend(array("i", [9, 9, 9, 9]))
    seq.num_computed_tokens = 17
    seq.block_table.append(1)
    steady.skipped(4)
    assert steady.advance == 4 and steady.steady[seq] == 4 + 32 - 17
    assert steady._keys[seq] == 13 and steady.plain_context() == (17, 17)


def test_a_short_segment_is_summed_as_one_step_at_a_time():
    """quiet_segment_ends_s's own loop: each step priced by decode_step_s and added to the end before, its contexts a
    token longer a row each step, up to the horizon (crossed: the step it falls in kept)."""
    from sim.profiled_cost_model import ProfiledCostModel, find_profile
    from sim.runner import CostModelRunner

    model = ProfiledCostModel.load(find_profile("qwen3-0.6b", "h200"))
    runner = CostModelRunner(model)
    bs, context, longest = 100, 100 * 700, 900
    ends = runner.quiet_segment_ends_s(bs, context, longest, 0, 5.0, 8, 5.0 + 3.5 * 0.02, cross_horizon=True)
    expected, t_s = [], 5.0
    for k in range(8):
        t_s = t_s + model.decode_step_s(bs, context + bs * k, longest + k, 0 if k == 0 else 1)
        expected.append(t_s)
        if t_s >= 5.0 + 3.5 * 0.02:
            break
    assert isinstance(ends, array) and list(ends) == expected
