"""Hostile-input probe (session 21, C): trace tools; each test failed before its fix."""

from __future__ import annotations

import pytest

from tests.traces.helpers import cli_error
from traces.convert import main as convert_main
from traces.synth import main as synth_main

_GOOD = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'


@pytest.mark.parametrize(("line", "key"), [
    ('{"timestamp": 1, "timestamp": 2, "input_length": 10, "output_length": 1, "hash_ids": [1]}', "'timestamp'"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1], "output_length": 900}',
     "'output_length'"),
    # a key repeated in an object nested in an extra field: the file is not what it seems either
    ('{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1], "x": {"a\\n": 1, "a\\n": 2}}',
     r"'a\n'"),
])
def test_mooncake_refuses_a_key_given_twice(tmp_path, capsys, line: str, key: str) -> None:
    """json keeps the last value of a repeated key: {"timestamp": 1, "timestamp": 2} was converted as an arrival
    at 2 ms, with no word that the line says two things."""
    src, out = tmp_path / "m.jsonl", tmp_path / "out.parquet"
    src.write_text(_GOOD + line + "\n")
    error = cli_error(convert_main, ["mooncake", str(src), "-o", str(out)], capsys)
    assert error == (f"error: {src}: line 2: key {key} appears twice in one object; expected each key once (JSON "
                     "would keep the last value silently)")
    assert not out.exists()


def test_mooncake_keys_given_once_still_convert(tmp_path) -> None:
    src, out = tmp_path / "m.jsonl", tmp_path / "out.parquet"
    src.write_text(_GOOD + '{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1], "x": {"a": 1}}\n')
    assert convert_main(["mooncake", str(src), "-o", str(out)]) == 0
    assert out.is_file()


def test_convert_and_synth_print_an_output_path_with_a_newline_on_one_line(tmp_path, capsys) -> None:
    """'wrote N requests to OUT: ...' was printed over two lines for -o 'a<newline>b.parquet'."""
    src, out = tmp_path / "m.jsonl", tmp_path / "a\nb.parquet"
    src.write_text(_GOOD)
    assert convert_main(["mooncake", str(src), "-o", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote 1 request to {str(tmp_path)}/a\\nb.parquet: span ")
    assert out.is_file()
    out2 = tmp_path / "c\nd.parquet"
    assert synth_main(["-o", str(out2), "--num-requests", "1", "--qps", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote 1 request to {str(tmp_path)}/c\\nd.parquet: span ")
    error = cli_error(convert_main, ["mooncake", str(src), "-o", str(out)], capsys)
    assert error == f"error: -o {str(tmp_path)}/a\\nb.parquet: exists; pass --overwrite to replace it"
