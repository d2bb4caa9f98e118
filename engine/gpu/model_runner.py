"""Runs a scheduled batch through the model: the GPU (or CPU) implementation of the Runner protocol.

Per step: pack the batch (decode rows first, then prefill chunks) into flat token, position and
slot tensors plus attention metadata; run the model (a captured CUDA graph for decode-only steps,
piecewise CUDA graphs around eager attention for prefill and mixed steps up to
``max_cuda_graph_tokens``, eagerly otherwise); compute logits only where a token is sampled; sample.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np
import torch

from engine.core.config import cdiv
from engine.core.model_config import ModelShape
from engine.core.runner import RunnerOutput
from engine.core.scheduler import ScheduledBatch
from engine.gpu.attention import AttentionMetadata, default_backend, get_backend
from engine.gpu.attention.triton_kernels_host import (
    LONG_SEQ_SLOTS,
    NO_SPLITS,
    DecodeSplits,
    decode_row_order,
    decode_splits,
    long_decode_rows,
)
from engine.gpu.layers.sampler import MASK32, SamplingRows, SamplingTensors, sample
from engine.gpu.loader import init_dummy, load_safetensors
from engine.gpu.models import DecoderForCausalLM
from engine.gpu.parallel import SINGLE, ParallelContext
from engine.gpu.piecewise_graphs import PiecewiseGraphs
from engine.options import EngineOptions, cuda_device_problem

_log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class StepTimings:
    """Accumulated seconds per part of a step (forward and sampling from CUDA events on GPU)."""

    num_steps: int = 0
    prepare_s: float = 0.0
    execute_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    num_graph_steps: int = 0
    num_piecewise_steps: int = 0
    num_prepared_steps: int = 0  # decode steps whose plan was prepared during the step before (NextDecode)
    num_ran_ahead_steps: int = 0  # decode steps launched on the device during the step before (RanAhead)
    num_discarded_ahead_steps: int = 0  # steps launched ahead for a batch that turned out otherwise (computed again)
    num_held_ahead_steps: int = 0  # steps not launched ahead because a request was arriving (arrivals_pending)


@dataclass
class StepPlan:
    """One step's inputs on the host, in the flattened order (decode rows, then prefill chunks)."""

    ids: list[int]
    positions: list[int] | np.ndarray
    slots: list[int] | np.ndarray
    num_decode: int
    decode_tables: np.ndarray | None
    logits_indices: list[int]
    sample_rows: list[int]  # batch index of each sampled row, in logits order
    q_lens: list[int] = field(default_factory=list)
    context_lens: list[int] = field(default_factory=list)
    prefill_tables: np.ndarray | None = None
    graph_bs: int = 0  # > 0: replay the graph captured for this many decode rows
    piecewise_size: int = 0  # > 0: replay the piecewise graphs captured for this many batched tokens


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor | None  # None: the first num_logits rows (a decode batch where every row samples)
    num_logits: int
    graph_batch_size: int = 0
    piecewise_size: int = 0


@dataclass
class NextDecode:
    """The next step's plan, prepared while this step runs on the GPU, for the batch decoding goes on with
    most of the time: the same sequences in the same order, each one token on. ``run`` uses it only when
    the scheduler says the batch is exactly that one (``ScheduledBatch.continues_batch``, which the simulator
    prices by too) and every row is where it was planned; otherwise it plans afresh, so nothing the scheduler
    does depends on it. What cannot be known before the scheduler has run is filled in then: the tokens this
    step samples, and the slots of rows whose next token opens a block (the scheduler allocates it)."""

    positions: list[int]
    plan: StepPlan
    sampling: SamplingRows | None
    boundary_rows: list[int]
    graph_host: tuple[np.ndarray, np.ndarray] | None  # _graph_host's arrays, when the plan replays a graph


@dataclass
class RanAhead:
    """The next step, launched on the device right behind this one, before this one's tokens reach the host (as
    vLLM's async scheduling and SGLang's overlap scheduler hide the host's work behind the device's). Launched
    only after a decode-only step in which every row samples, none reaches its length limit and no request can be
    admitted next (``ScheduledBatch.next_admits_none``): the next batch is then this one, each row one token on,
    unless a row samples a stop token, a request is aborted or the cache must preempt. Its input ids are this step's
    sampled ids, copied on the device. A row whose next token opens a block the scheduler has not allocated yet
    writes that token's K/V into a scratch block outside the block manager's, which its block table points to;
    ``_take_ran_ahead`` copies the scratch block into the block the scheduler then allocates.

    The scheduler decides as it always does: ``run`` uses this step only when the batch it is given is exactly the
    one launched (the NextDecode check), so the schedule and the tokens are those of the engine without it. When
    the batch is otherwise the launched step is thrown away, its random word handed back, and the batch computed
    afresh. What it wrote is harmless: each row's K/V for its next position, with the right token, into a slot of
    a block the sequence held and that no prefix-cache entry covers (the block is not full before that token), or
    into a scratch block; a later step that reuses the slot writes it again first (one stream orders them)."""

    positions: list[int]
    plan: StepPlan
    sampling: SamplingRows | None
    boundary_rows: list[int]
    scratch_blocks: list[int]
    tokens: torch.Tensor | None
    fetched: object  # its sampled ids on their way to the host (_fetch_tokens)
    step_bits: int | None  # the random word its sampling drew
    events: list


def resolve_device(options: EngineOptions) -> torch.device:
    if options.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(options.device)
    # cuda:7 on a one-GPU host failed deep in torch ('invalid device ordinal'), after the config had been read.
    problem = cuda_device_problem(options.device, torch.cuda) if device.type == "cuda" else None
    if problem:
        raise ValueError(problem)
    return device


def resolve_dtype(options: EngineOptions, device: torch.device) -> torch.dtype:
    if options.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[options.dtype]


class ModelRunner:
    def __init__(
        self,
        options: EngineOptions,
        shape: ModelShape,
        model_dir: Path | None,
        parallel: ParallelContext = SINGLE,
        device: torch.device | None = None,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        """``eos_token_ids``: the engine's (its scheduler's), which a request's min_tokens masks with its stop tokens
        (engine.gpu.layers.sampler.SamplingRows)."""
        self.options = options
        self.shape = shape
        self.eos_token_ids = frozenset(eos_token_ids)
        self.parallel = parallel
        self.device = device or resolve_device(options)
        self.dtype = resolve_dtype(options, self.device)
        self.block_size = options.block_size
        self.max_model_len = options.max_model_len or shape.max_position_embeddings
        self.max_blocks_per_seq = cdiv(self.max_model_len, self.block_size)
        backend_name = options.attention_backend
        if backend_name == "auto":
            backend_name = default_backend(self.device.type)
        self.attention_backend_name = backend_name  # what 'auto' became: a run folder records what ran
        self.backend = get_backend(backend_name, self.device.type)
        if options.overlap_decode_attention:  # the options allow it with the triton backend only
            self.backend.overlap_decode = True
        self.timings = StepTimings()
        # Per-step (prepare, launch, wait, GPU forward, GPU sampling) seconds, when a list is put here.
        self.step_timings: list[tuple[float, float, float, float, float]] | None = None
        self._rng = random.Random(options.seed)  # unseeded rows' noise: reproducible for one engine seed
        self._next_decode: NextDecode | None = None
        self.prepare_ahead = True  # NextDecode on; benchmarks turn it off to measure what it saves
        self._is_cuda = self.device.type == "cuda"
        self._num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count if self._is_cuda else 1
        self._events = self._event_set()
        self._ahead_events = self._event_set()  # the step launched ahead records its own
        # Run-ahead (RanAhead) on one device: tensor-parallel workers run the plans the driver broadcasts, and a
        # step launched ahead has no plan of its own ids to send. Benchmarks may turn it off after construction.
        self.run_ahead = options.run_ahead and not parallel.enabled
        self._ran_ahead: RanAhead | None = None
        # Whoever feeds the engine requests while it steps (a server's engine loop, a trace replay) may say here
        # whether one has come since the step was scheduled: the next batch would then admit it, and a step launched
        # ahead would be computed in vain, one step of device time before the new request's. Asked once the
        # step's forward is done, just before the launch, so that the window a request can still slip in by is the
        # step's sampling alone. None: nothing arrives between steps (offline generate).
        self.arrivals_pending: Callable[[], bool] | None = None
        self._returned_bits: int | None = None  # a discarded step's random word, for the step computed instead

        torch.manual_seed(options.seed)
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                self.model = DecoderForCausalLM(shape, self.max_model_len, self.backend, parallel)
        finally:
            torch.set_default_dtype(default_dtype)
        if options.load_format == "dummy" or model_dir is None:
            init_dummy(self.model, options.seed)
        else:
            load_safetensors(self.model, model_dir)
        self.model.eval()
        self.num_kv_heads = self.model.model.layers[0].self_attn.num_kv_heads
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.piecewise: PiecewiseGraphs | None = None
        piecewise_tokens = min(options.max_cuda_graph_tokens, options.max_num_batched_tokens)
        if self._is_cuda and not options.enforce_eager and piecewise_tokens > 0:
            # Static buffers first, so that the KV cache is sized around them.
            self.piecewise = PiecewiseGraphs(self.model, piecewise_tokens, self.device, self.dtype)
        self.num_scratch_blocks = self._num_scratch_blocks() if self.run_ahead else 0
        self.num_gpu_blocks = self._size_kv_cache()
        # The scratch blocks follow the block manager's (ids num_gpu_blocks and up), which never hands them out.
        self._allocate_kv_cache(self.num_gpu_blocks + self.num_scratch_blocks)
        self._scratch_blocks = list(range(self.num_gpu_blocks, self.num_gpu_blocks + self.num_scratch_blocks))
        if self._is_cuda and not options.enforce_eager:
            self._capture_graphs()
        if self._is_cuda:
            self._warm_up_kernels()

    def _warm_up_kernels(self) -> None:
        """Compile now the attention variants eager steps may need, not in the middle of serving (see
        ``triton_kernels.warm_up``). A failure here only postpones compilation to first use."""
        attn = self.model.attention_layers()[0]
        started = time.perf_counter()
        try:
            count = self.backend.warm_up(attn.k_cache, attn.v_cache, attn.num_heads, self.max_model_len,
                                         self.options.max_num_seqs, self.max_blocks_per_seq)
            torch.cuda.synchronize(self.device)
        except Exception as exc:  # noqa: BLE001 - any compiler error: serving still works, compiling later
            _log.warning("attention kernel warm-up failed (%s: %s); kernels compile on first use instead",
                         type(exc).__name__, exc)
            return
        _log.info("attention kernels: %d variants ready in %.1f s", count, time.perf_counter() - started)

    # ---- KV cache -------------------------------------------------------------------------------
    def _num_scratch_blocks(self) -> int:
        """Scratch blocks for the rows of a step launched ahead whose next token opens a block (RanAhead): about
        rows / block_size such rows a step when positions are spread, so twice that and four more (six blocks for
        256 rows of 256-token blocks); a step with more (rows in lockstep) is not launched ahead."""
        max_rows = self.options.max_num_seqs
        return min(max_rows, 2 * cdiv(max_rows, self.block_size) + 4)

    def _block_bytes(self) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.shape.num_layers * self.num_kv_heads * self.block_size * self.shape.head_dim * element

    def _allocate_kv_cache(self, num_blocks: int) -> None:
        layers = self.model.attention_layers()
        shape = self.backend.cache_shape(num_blocks, self.block_size, self.num_kv_heads, self.shape.head_dim)
        self.kv_cache = torch.empty((2, len(layers), *shape), dtype=self.dtype, device=self.device)
        for i, attn in enumerate(layers):
            attn.k_cache = self.kv_cache[0, i]
            attn.v_cache = self.kv_cache[1, i]

    @torch.inference_mode()
    def _size_kv_cache(self) -> int:
        """Run a warm-up forward at the token budget, then give the KV cache what memory remains."""
        opts = self.options
        if opts.num_gpu_blocks is not None and not self._is_cuda:
            return opts.num_gpu_blocks
        if not self._is_cuda:
            # CPU: room for every sequence at full length, capped at 2 GiB.
            wanted = opts.max_num_seqs * self.max_blocks_per_seq
            return max(1, min(wanted, (2 << 30) // self._block_bytes()))
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        seq_len = min(self.max_model_len, opts.max_num_batched_tokens)
        num_seqs = max(1, min(opts.max_num_seqs, opts.max_num_batched_tokens // seq_len))
        warmup_blocks = num_seqs * cdiv(seq_len, self.block_size)
        self._allocate_kv_cache(warmup_blocks)
        self._warmup_forward(num_seqs, seq_len)
        torch.cuda.synchronize(self.device)
        warmup_cache_bytes = self.kv_cache.numel() * self.kv_cache.element_size()
        stats = torch.cuda.memory_stats(self.device)
        peak = stats["allocated_bytes.all.peak"] - warmup_cache_bytes
        del self.kv_cache
        for attn in self.model.attention_layers():
            attn.k_cache = attn.v_cache = torch.empty(0)
        torch.cuda.empty_cache()
        current = torch.cuda.memory_stats(self.device)["allocated_bytes.all.current"]
        free, total = torch.cuda.mem_get_info(self.device)
        used = total - free
        activations = peak - current
        # The piecewise graphs' pool holds the temporaries of the largest bucket's pieces, beside the eager
        # allocator's: reserve the eager forward's peak for it, plus a quarter (measured after capture on the
        # H200, ``PiecewiseGraphs.pool_bytes``: 300 MB against a 272 MB peak for Qwen3-0.6B, 882 against 864 MB
        # for Qwen3-8B, at 8,192 tokens).
        graph_pool = int(1.25 * activations) if self.piecewise is not None else 0
        available = total * opts.gpu_memory_utilization - used - activations - graph_pool
        num_blocks = self.parallel.min_across_ranks(int(available // self._block_bytes()), self.device)
        num_blocks -= self.num_scratch_blocks
        self.graph_pool_reserved_bytes = graph_pool
        if opts.num_gpu_blocks is not None:
            if opts.num_gpu_blocks > num_blocks:
                raise ValueError(f"num_gpu_blocks={opts.num_gpu_blocks} does not fit: at most {num_blocks} blocks fit")
            return opts.num_gpu_blocks
        if num_blocks < 1:
            raise ValueError(
                f"no memory left for the KV cache at gpu_memory_utilization={opts.gpu_memory_utilization} "
                f"(weights and activations use {(used + activations + graph_pool) / 2**30:.1f} GiB of "
                f"{total / 2**30:.1f} GiB)"
            )
        return num_blocks

    def _warmup_forward(self, num_seqs: int, seq_len: int) -> None:
        """A prefill of ``num_seqs`` sequences of ``seq_len`` tokens: the largest step the scheduler may form."""
        blocks_per_seq = cdiv(seq_len, self.block_size)
        positions = np.tile(np.arange(seq_len, dtype=np.int64), num_seqs)
        seq_index = np.repeat(np.arange(num_seqs, dtype=np.int64), seq_len)
        plan = StepPlan(
            ids=[1] * (num_seqs * seq_len),
            positions=positions,
            slots=seq_index * blocks_per_seq * self.block_size + positions,
            num_decode=0,
            decode_tables=None,
            logits_indices=[(i + 1) * seq_len - 1 for i in range(num_seqs)],
            sample_rows=list(range(num_seqs)),
            q_lens=[seq_len] * num_seqs,
            context_lens=[0] * num_seqs,
            prefill_tables=np.arange(num_seqs * blocks_per_seq, dtype=np.int32).reshape(num_seqs, blocks_per_seq),
        )
        self.broadcast_plan(plan)
        sampling = SamplingTensors([1.0] * num_seqs, [-1] * num_seqs, [1.0] * num_seqs,
                                   [(0, row, MASK32) for row in range(num_seqs)], self.device)
        self.execute(self.materialize(plan), sampling)

    # ---- host -> device -------------------------------------------------------------------------
    def _to_device(self, values, dtype: torch.dtype) -> torch.Tensor:
        host = torch.as_tensor(values, dtype=dtype)
        if not self._is_cuda:
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def _block_table_array(self, tables: list[list[int]], width: int | None = None) -> np.ndarray:
        width = width or self.max_blocks_per_seq
        out = np.zeros((len(tables), width), dtype=np.int32)
        lengths = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
        total = int(lengths.sum())
        if total:
            flat = np.fromiter(chain.from_iterable(tables), dtype=np.int32, count=total)
            rows = np.repeat(np.arange(len(tables)), lengths)
            starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
            out[rows, np.arange(total) - starts] = flat
        return out

    def _decode_splits(self, num_decode: int) -> DecodeSplits:
        if not self._is_cuda:
            return NO_SPLITS
        return decode_splits(num_decode, self.num_kv_heads, self.max_model_len, self._num_sms)

    # ---- one step -------------------------------------------------------------------------------
    def plan(self, batch: ScheduledBatch) -> StepPlan:
        """Pack the batch on the host: decode rows first, then prefill chunks (picklable, for TP workers)."""
        bs = self.block_size
        seqs = batch.seqs
        new_tokens = batch.num_new_tokens
        if batch.num_prefill_seqs == 0:
            decode_rows = list(range(len(seqs)))
            prefill_rows: list[int] = []
        else:
            decode_rows = [i for i, n in enumerate(new_tokens) if n == 1]
            prefill_rows = [i for i, n in enumerate(new_tokens) if n > 1]
        decode_seqs = [seqs[i] for i in decode_rows]
        positions = [s.num_computed_tokens for s in decode_seqs]
        ids = [s.token_ids[p] for s, p in zip(decode_seqs, positions)]
        slots = [s.block_table[p // bs] * bs + p % bs for s, p in zip(decode_seqs, positions)]
        sample_rows: list[int] = []
        logits_indices: list[int] = []
        for offset, (row, seq, p) in enumerate(zip(decode_rows, decode_seqs, positions)):
            if p + 1 == seq.num_tokens:
                sample_rows.append(row)
                logits_indices.append(offset)
        num_decode = len(decode_rows)
        plan = StepPlan(
            ids=ids,
            positions=positions,
            slots=slots,
            num_decode=num_decode,
            decode_tables=self._block_table_array([s.block_table for s in decode_seqs]) if num_decode else None,
            logits_indices=logits_indices,
            sample_rows=sample_rows,
        )
        if prefill_rows:
            position_parts = [np.asarray(positions, dtype=np.int64)]
            slot_parts = [np.asarray(slots, dtype=np.int64)]
            offset = num_decode
            tables = []
            for row in prefill_rows:
                seq = seqs[row]
                start, n = seq.num_computed_tokens, new_tokens[row]
                ids.extend(seq.token_ids[start : start + n])
                pos = np.arange(start, start + n, dtype=np.int64)
                table = np.asarray(seq.block_table, dtype=np.int64)
                position_parts.append(pos)
                slot_parts.append(table[pos // bs] * bs + pos % bs)
                plan.q_lens.append(n)
                plan.context_lens.append(start)
                tables.append(seq.block_table)
                offset += n
                if start + n == seq.num_tokens:
                    sample_rows.append(row)
                    logits_indices.append(offset - 1)
            plan.positions = np.concatenate(position_parts)
            plan.slots = np.concatenate(slot_parts)
            plan.prefill_tables = self._block_table_array(tables)
            if self.piecewise is not None:
                plan.piecewise_size = self.piecewise.bucket(offset)
        elif self.graphs and num_decode <= self._max_graph_bs:
            plan.graph_bs = next(b for b in self._graph_sizes if b >= num_decode)
        elif self.piecewise is not None:  # a decode batch past the largest decode graph
            plan.piecewise_size = self.piecewise.bucket(num_decode)
        return plan

    def materialize(self, plan: StepPlan, graph_host: tuple[np.ndarray, np.ndarray] | None = None) -> StepInputs:
        """Device tensors for a plan (or the captured graph's static buffers, filled in place)."""
        if plan.graph_bs:
            meta = self._upload_graph_inputs(plan.graph_bs, *(graph_host or self._graph_host(plan)))
            input_ids = self._graph_ids[: plan.graph_bs]
            positions = self._graph_positions[: plan.graph_bs]
        else:
            num_decode = plan.num_decode
            if plan.piecewise_size:
                input_ids, positions, slots = self._stage_piecewise(plan)
            else:
                slots = self._to_device(plan.slots, torch.int64)
                input_ids = self._to_device(plan.ids, torch.int64)
                positions = self._to_device(plan.positions, torch.int64)
            meta = AttentionMetadata(slot_mapping=slots, num_decode_tokens=num_decode)
            if num_decode:
                context = [p + 1 for p in plan.positions[:num_decode]]
                meta.decode_block_tables = self._to_device(plan.decode_tables, torch.int32)
                meta.decode_context_lens = self._to_device(context, torch.int32)
                meta.host_decode_context_lens = [int(c) for c in context]
                meta.decode_splits = splits = self._decode_splits(num_decode)
                meta.decode_row_order = self._to_device(decode_row_order(context), torch.int32)
                if splits.num_long_seqs:
                    meta.decode_long_seqs = self._to_device(long_decode_rows(context, splits), torch.int32)
            if plan.q_lens:
                cu = np.zeros(len(plan.q_lens) + 1, dtype=np.int32)
                np.cumsum(plan.q_lens, out=cu[1:])
                meta.num_prefill_seqs = len(plan.q_lens)
                meta.prefill_cu_seqlens_q = self._to_device(cu, torch.int32)
                meta.prefill_context_lens = self._to_device(plan.context_lens, torch.int32)
                meta.prefill_block_tables = self._to_device(plan.prefill_tables, torch.int32)
                meta.prefill_max_q_len = max(plan.q_lens)
                meta.prefill_max_k_len = max(c + q for c, q in zip(plan.context_lens, plan.q_lens))
                meta.host_prefill_q_lens = plan.q_lens
                meta.host_prefill_context_lens = plan.context_lens
        num_logits = len(plan.logits_indices)
        # Every row of a decode batch samples, in order: its logits are a slice, with no index to copy.
        leading = not plan.q_lens and num_logits == plan.num_decode
        return StepInputs(
            input_ids=input_ids,
            positions=positions,
            meta=meta,
            logits_indices=None if leading else self._to_device(plan.logits_indices, torch.int64),
            num_logits=num_logits,
            graph_batch_size=plan.graph_bs,
            piecewise_size=plan.piecewise_size,
        )

    def _stage_piecewise(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[ids | positions | slots] padded to the bucket (padding: token 0 at position 0, slot -1, never
        stored), one host-to-device copy into the piecewise graphs' static inputs; their real rows."""
        size = plan.piecewise_size
        n = len(plan.ids)
        host = np.zeros(3 * size, dtype=np.int64)
        host[:n] = plan.ids
        host[size : size + n] = plan.positions
        host[2 * size : 2 * size + n] = plan.slots
        host[2 * size + n :] = -1
        self.piecewise.stage(torch.from_numpy(host).pin_memory())
        inputs = self.piecewise.inputs
        return inputs[:n], inputs[size : size + n], inputs[2 * size : 2 * size + n]

    def _sampling_rows(self, batch: ScheduledBatch, plan: StepPlan) -> SamplingRows | None:
        if not plan.sample_rows:
            return None
        seqs = batch.seqs
        return SamplingRows([seqs[row] for row in plan.sample_rows], self.shape.vocab_size, self.eos_token_ids)

    @torch.inference_mode()
    def execute(self, inputs: StepInputs, sampling: SamplingTensors | None,
                events: list | None = None) -> torch.Tensor | None:
        """Forward, logits where sampled, sampling; returns token ids (None on ranks other than the first)."""
        events = (events or self._events) if self._is_cuda else None
        if events:
            events[0].record()
        if inputs.graph_batch_size:
            self.graphs[inputs.graph_batch_size].replay()
            hidden = self._graph_outputs[inputs.graph_batch_size]
        elif inputs.piecewise_size:
            hidden = self.piecewise.run(inputs.piecewise_size, inputs.input_ids.shape[0], inputs.meta)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, inputs.meta)
        if events:
            events[1].record()
        tokens = None
        if inputs.num_logits:
            rows = hidden[: inputs.num_logits] if inputs.logits_indices is None else hidden[inputs.logits_indices]
            logits = self.model.compute_logits(rows)  # collective under TP
            if logits is not None and sampling is not None:
                tokens = sample(logits, sampling)
        if events:
            events[2].record()
        return tokens

    def _event_set(self) -> list:
        return [torch.cuda.Event(enable_timing=True) for _ in range(3)] if self.device.type == "cuda" else []

    def _step_bits(self) -> int:
        """The unseeded rows' random word for a step: the one a discarded step launched ahead drew, else the next
        of the runner's stream (so the words go to the steps computed in the order they would without run-ahead)."""
        bits, self._returned_bits = self._returned_bits, None
        return self._rng.getrandbits(32) if bits is None else bits

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> RunnerOutput:
        t0 = time.perf_counter()
        ahead = self._take_ran_ahead(batch)
        if ahead is not None:  # launched during the step before: its work is on the device already
            plan, rows, tokens, fetched = ahead.plan, ahead.sampling, ahead.tokens, ahead.fetched
            self._events, self._ahead_events = ahead.events, self._events
            self.timings.num_ran_ahead_steps += 1
            t1 = time.perf_counter()
        else:
            ready = self._take_next_decode(batch)
            if ready is None:
                plan = self.plan(batch)
                rows = self._sampling_rows(batch, plan)
                graph_host = None
            else:
                plan, rows, graph_host = ready.plan, ready.sampling, ready.graph_host
                self.timings.num_prepared_steps += 1
            # Sampling inputs first: a request that cannot be sampled fails here, before the tensor-parallel
            # workers are told to run the step.
            sampling = rows.tensors(self._step_bits(), self.device) if rows is not None else None
            self.broadcast_plan(plan)
            inputs = self.materialize(plan, graph_host)
            t1 = time.perf_counter()
            tokens = self.execute(inputs, sampling)
            fetched = self._fetch_tokens(tokens)
        t_launched = time.perf_counter()
        held = False
        if self._may_run_ahead(batch, plan, tokens):
            try:
                self._ran_ahead, held = self._launch_ahead(batch, plan, rows, tokens)
            except Exception as exc:  # noqa: BLE001 - this step's tokens are computed: the next is planned afresh
                _log.warning("launching the next step ahead failed (%s: %s); it runs when scheduled",
                             type(exc).__name__, exc, exc_info=True)
                self._ran_ahead = None
        if (self._ran_ahead is None and not held and self.prepare_ahead and not batch.num_prefill_seqs
                and len(plan.sample_rows) == len(batch.seqs)):
            self._next_decode = self._prepare_next_decode(batch, plan, rows)  # while the GPU runs this step
        token_ids = [-1] * len(batch.seqs)
        if tokens is not None:
            for row, token in zip(plan.sample_rows, self._host_tokens(fetched)):
                token_ids[row] = token
        t2 = time.perf_counter()
        timings = self.timings
        timings.num_steps += 1
        timings.prepare_s += t1 - t0
        timings.execute_s += t2 - t1  # launch, GPU time of forward and sampling, and the wait for it
        forward_s = sample_s = 0.0
        if self._is_cuda:
            self._events[2].synchronize()  # steps that sample nothing never waited on the GPU
            forward_s = self._events[0].elapsed_time(self._events[1]) / 1e3
            sample_s = self._events[1].elapsed_time(self._events[2]) / 1e3
            timings.forward_s += forward_s
            timings.sample_s += sample_s
        if self.step_timings is not None:
            self.step_timings.append((t1 - t0, t_launched - t1, t2 - t_launched, forward_s, sample_s))
        if plan.graph_bs:
            timings.num_graph_steps += 1
        elif plan.piecewise_size:
            timings.num_piecewise_steps += 1
        return RunnerOutput(token_ids, ran_ahead=ahead is not None)

    # ---- run-ahead ------------------------------------------------------------------------------
    def _may_run_ahead(self, batch: ScheduledBatch, plan: StepPlan, tokens: torch.Tensor | None) -> bool:
        """Whether the next step is this batch again, each row one token on, unless a row samples a stop token (or
        a request is aborted, or a block must be preempted for): see RanAhead."""
        if not (self.run_ahead and tokens is not None and batch.next_admits_none and not batch.num_prefill_seqs
                and not plan.piecewise_size and len(plan.sample_rows) == len(batch.seqs)):
            return False
        # A row whose token this step brings to its length limit finishes (Scheduler._postprocess_row).
        return all(len(seq.token_ids) + 1 < seq.max_num_tokens for seq in batch.seqs)

    def _launch_ahead(self, batch: ScheduledBatch, plan: StepPlan, rows: SamplingRows | None,
                      tokens: torch.Tensor) -> tuple[RanAhead | None, bool]:
        """Launch the next step of this batch behind this one (see RanAhead); None where it cannot be, with True
        where it was held back for a request arriving (``arrivals_pending``)."""
        nxt, boundary_rows = self._plan_one_token_on(batch, plan)
        if len(boundary_rows) > len(self._scratch_blocks):
            return None, False
        scratch = self._scratch_blocks[: len(boundary_rows)]
        bs = self.block_size
        for row, block in zip(boundary_rows, scratch):  # their tokens' K/V go to a scratch block meanwhile
            nxt.decode_tables[row, nxt.positions[row] // bs] = block
            nxt.slots[row] = block * bs
        sampling_rows = rows.advanced() if rows is not None else None
        bits = self._step_bits() if sampling_rows is not None else None
        try:
            return self._launch_planned(nxt, sampling_rows, bits, tokens, boundary_rows, scratch)
        except Exception:  # the step computed afresh meets it (a request it cannot sample fails there, RequestError)
            self._returned_bits = bits
            raise

    def _launch_planned(self, nxt: StepPlan, sampling_rows: SamplingRows | None, bits: int | None,
                        tokens: torch.Tensor, boundary_rows: list[int],
                        scratch: list[int]) -> tuple[RanAhead | None, bool]:
        try:
            sampling = sampling_rows.tensors(bits, self.device) if sampling_rows is not None else None
        except Exception:  # noqa: BLE001 - a request it cannot sample: the step computed afresh fails it (RequestError)
            self._returned_bits = bits  # quietly: a bad request is no launch failure worth a logged traceback
            return None, False
        positions = nxt.positions
        num_rows = len(positions)
        nxt.ids = [0] * num_rows  # placeholders: the ids are this step's sampled ones, below
        inputs = self.materialize(nxt)
        # This step's sampled ids are the next step's inputs, copied on the device: the host has not seen them.
        if nxt.graph_bs:
            self._graph_ids[:num_rows].copy_(tokens)
        else:
            inputs.input_ids = tokens
        # A full batch admits nobody next step: what arrives meanwhile waits either way.
        if self.arrivals_pending is not None and len(positions) < self.options.max_num_seqs:
            if self._is_cuda:
                self._events[1].synchronize()  # this step's forward is done; its logits and sampling remain
            try:
                pending = self.arrivals_pending()
            except Exception as exc:  # noqa: BLE001 - a hint that fails must not fail the step already computed
                _log.warning("arrivals_pending failed (%s: %s): the next step is not launched ahead",
                             type(exc).__name__, exc)
                pending = True
            if pending:
                self.timings.num_held_ahead_steps += 1
                self._returned_bits = bits
                return None, True
        events = self._ahead_events
        next_tokens = self.execute(inputs, sampling, events)
        return RanAhead(positions, nxt, sampling_rows, boundary_rows, scratch, next_tokens,
                        self._fetch_tokens(next_tokens), bits, events), False

    def _fetch_tokens(self, tokens: torch.Tensor | None) -> object:
        """Start copying a step's sampled ids to the host, behind its sampling alone: ``tolist()`` waits for every
        kernel launched so far, and so for the step launched ahead behind it too (the host then idled as long)."""
        if tokens is None or not self._is_cuda:
            return tokens
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, done

    @staticmethod
    def _host_tokens(fetched) -> list[int]:
        """The ids ``_fetch_tokens`` started copying, once there."""
        if isinstance(fetched, tuple):
            host, done = fetched
            done.synchronize()
            return host.tolist()
        return fetched.tolist()

    def _take_ran_ahead(self, batch: ScheduledBatch) -> RanAhead | None:
        """The step launched ahead, if ``batch`` is the batch it was launched for; else None, the launched step
        thrown away (its random word handed back)."""
        ahead, self._ran_ahead = self._ran_ahead, None
        if ahead is None:
            return None
        seqs = batch.seqs
        if not _repeats(batch, ahead.positions):
            if ahead.step_bits is not None:
                self._returned_bits = ahead.step_bits
            self.timings.num_discarded_ahead_steps += 1
            return None
        self._next_decode = None
        if ahead.boundary_rows:
            bs = self.block_size
            plan = ahead.plan
            blocks = []
            for row in ahead.boundary_rows:  # the blocks the scheduler allocated for those tokens: the plan's now
                p = ahead.positions[row]
                block = seqs[row].block_table[p // bs]
                blocks.append(block)
                plan.decode_tables[row, p // bs] = block
                plan.slots[row] = block * bs
            self._copy_blocks(ahead.scratch_blocks, blocks)
        return ahead

    def _copy_blocks(self, sources: list[int], targets: list[int]) -> None:
        """Copy whole KV blocks, every layer's K and V (on the stream, behind the step that wrote them)."""
        source = self._to_device(sources, torch.int64)
        target = self._to_device(targets, torch.int64)
        self.kv_cache.index_copy_(2, target, self.kv_cache.index_select(2, source))

    def _prepare_next_decode(self, batch: ScheduledBatch, plan: StepPlan, rows: SamplingRows | None) -> NextDecode:
        nxt, boundary_rows = self._plan_one_token_on(batch, plan)
        graph_host = self._graph_host(nxt) if nxt.graph_bs else None
        sampling = rows.advanced() if rows is not None else None
        return NextDecode(nxt.positions, nxt, sampling, boundary_rows, graph_host)

    def _plan_one_token_on(self, batch: ScheduledBatch, plan: StepPlan) -> tuple[StepPlan, list[int]]:
        """The plan of ``batch`` one token on, from this decode step's ``plan`` (no ids: they are sampled now), and
        the rows whose next token opens a block the scheduler has not allocated yet (their slot -1, their block
        table shared with this plan's unless they exist, when it is a copy for the caller to patch)."""
        bs = self.block_size
        positions = [p + 1 for p in plan.positions]
        boundary_rows = [row for row, p in enumerate(positions) if p % bs == 0]
        slots = [s.block_table[p // bs] * bs + p % bs if p % bs else -1 for s, p in zip(batch.seqs, positions)]
        tables = plan.decode_tables.copy() if boundary_rows else plan.decode_tables  # this step's plan keeps its own
        nxt = StepPlan(ids=[], positions=positions, slots=slots, num_decode=plan.num_decode, decode_tables=tables,
                       logits_indices=plan.logits_indices, sample_rows=plan.sample_rows, graph_bs=plan.graph_bs,
                       piecewise_size=plan.piecewise_size)
        return nxt, boundary_rows

    def _take_next_decode(self, batch: ScheduledBatch) -> NextDecode | None:
        """The prepared next step, completed, if ``batch`` is the batch it was prepared for; else None."""
        nxt, self._next_decode = self._next_decode, None
        if nxt is None or not _repeats(batch, nxt.positions):
            return None
        seqs = batch.seqs
        plan = nxt.plan
        bs = self.block_size
        plan.ids = ids = [s.token_ids[p] for s, p in zip(seqs, nxt.positions)]
        host, tables = nxt.graph_host or (None, None)
        for row in nxt.boundary_rows:
            p = nxt.positions[row]
            block = seqs[row].block_table[p // bs]
            plan.slots[row] = block * bs
            plan.decode_tables[row, p // bs] = block
            if host is not None:
                host[2 * plan.graph_bs + row] = block * bs
                tables[row, p // bs] = block
        if host is not None:
            host[: len(ids)] = ids
        return nxt

    def release(self, seqs) -> None:
        """Nothing is kept per request: sampling noise is counter-based (see engine.gpu.layers.sampler)."""

    # ---- CUDA graphs ----------------------------------------------------------------------------
    def _graph_sizes_for(self, max_bs: int) -> list[int]:
        sizes = [b for b in (1, 2, 4, 8) if b <= max_bs]
        sizes += list(range(16, max_bs + 1, 16))
        if sizes[-1] != max_bs:
            sizes.append(max_bs)
        return sizes

    @torch.inference_mode()
    def _capture_graphs(self) -> None:
        """Decode graphs for bucketed batch sizes, captured largest first into one memory pool, then the
        piecewise graphs of prefill and mixed steps into the same pool (one step runs at a time)."""
        max_bs = min(self.options.max_num_seqs, self.options.max_cuda_graph_batch_size)
        self._graph_sizes = self._graph_sizes_for(max_bs)
        self._max_graph_bs = max_bs
        dev = self.device
        self._graph_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self._graph_positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self._graph_slots = torch.full((max_bs,), -1, dtype=torch.int64, device=dev)
        self._graph_context = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self._graph_tables = torch.zeros(max_bs, self.max_blocks_per_seq, dtype=torch.int32, device=dev)
        self._graph_order = torch.arange(max_bs, dtype=torch.int32, device=dev)
        self._graph_long_seqs = torch.full((LONG_SEQ_SLOTS,), -1, dtype=torch.int32, device=dev)
        self._graph_meta: dict[int, AttentionMetadata] = {}
        self._graph_outputs: dict[int, torch.Tensor] = {}
        pool = None
        for bs in reversed(self._graph_sizes):
            splits = self._decode_splits(bs)
            meta = AttentionMetadata(
                slot_mapping=self._graph_slots[:bs],
                num_decode_tokens=bs,
                decode_block_tables=self._graph_tables[:bs],
                decode_context_lens=self._graph_context[:bs],
                decode_splits=splits,
                decode_long_seqs=self._graph_long_seqs[: splits.num_long_seqs] if splits.num_long_seqs else None,
                decode_row_order=self._graph_order[:bs],
            )
            self.model(self._graph_ids[:bs], self._graph_positions[:bs], meta)  # warm-up: compiles kernels
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                out = self.model(self._graph_ids[:bs], self._graph_positions[:bs], meta)
            if pool is None:
                pool = graph.pool()
            self.graphs[bs] = graph
            self._graph_outputs[bs] = out
            self._graph_meta[bs] = meta
            torch.cuda.synchronize(dev)
        if self.piecewise is not None:
            self.piecewise.capture(pool, dev)

    def _graph_host(self, plan: StepPlan) -> tuple[np.ndarray, np.ndarray]:
        """The graph's inputs on the host: [ids | positions | slots | context lengths | row order | long rows]
        and the block tables, padded to the graph's batch (padding rows: slot -1, never stored; context 0,
        so they start last). Ids are left 0 when the plan has none yet (a NextDecode fills them in)."""
        graph_bs = plan.graph_bs
        n = plan.num_decode
        splits = self._graph_meta[graph_bs].decode_splits
        num_long = splits.num_long_seqs
        flat = np.zeros(5 * graph_bs + num_long, dtype=np.int64)  # one host-to-device copy for all of it
        host = flat[: 5 * graph_bs].reshape(5, graph_bs)
        if plan.ids:
            host[0, :n] = plan.ids
        host[1, :n] = plan.positions
        host[2, :n] = plan.slots
        host[2, n:] = -1
        host[3, :n] = host[1, :n] + 1
        host[4] = decode_row_order(host[3])
        if num_long:
            flat[5 * graph_bs :] = long_decode_rows(host[3, :n], splits)
        tables = plan.decode_tables
        if graph_bs > n:
            tables = np.concatenate([tables, np.zeros((graph_bs - n, tables.shape[1]), dtype=np.int32)])
        return flat, tables

    def _upload_graph_inputs(self, graph_bs: int, flat: np.ndarray, tables: np.ndarray) -> AttentionMetadata:
        meta = self._graph_meta[graph_bs]
        num_long = meta.decode_splits.num_long_seqs
        staged = torch.from_numpy(flat).pin_memory().to(self.device, non_blocking=True)
        self._graph_ids[:graph_bs].copy_(staged[:graph_bs])
        self._graph_positions[:graph_bs].copy_(staged[graph_bs : 2 * graph_bs])
        self._graph_slots[:graph_bs].copy_(staged[2 * graph_bs : 3 * graph_bs])
        self._graph_context[:graph_bs].copy_(staged[3 * graph_bs : 4 * graph_bs])
        self._graph_order[:graph_bs].copy_(staged[4 * graph_bs : 5 * graph_bs])
        if num_long:
            self._graph_long_seqs[:num_long].copy_(staged[5 * graph_bs :])
        self._graph_tables[:graph_bs].copy_(torch.from_numpy(tables).pin_memory(), non_blocking=True)
        return meta

    def broadcast_plan(self, plan: StepPlan) -> None:
        """Hook for tensor parallelism: the driver sends each step's plan to its workers."""

    def close(self) -> None:
        """Release graphs, the KV cache and the weights now rather than at garbage collection."""
        self.graphs.clear()
        self.piecewise = None
        self._ran_ahead = self._next_decode = None
        self.__dict__.pop("_graph_outputs", None)
        self.__dict__.pop("_graph_meta", None)
        if getattr(self, "model", None) is not None:
            for attn in self.model.attention_layers():
                attn.k_cache = attn.v_cache = torch.empty(0)
        self.kv_cache = None
        self.model = None
        if self._is_cuda:
            torch.cuda.empty_cache()


def _repeats(batch: ScheduledBatch, positions: list[int]) -> bool:
    """Whether ``batch`` is the decode batch a step was planned (or launched) for: the scheduler says it repeats the
    last batch, and each row computes the position planned."""
    return bool(batch.continues_batch) and [s.num_computed_tokens for s in batch.seqs] == positions
