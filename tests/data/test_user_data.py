"""Your data: token files (FILE.bin) through numpy.memmap, checked in one line, never loaded whole."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CPU

from speedladder.cli import main
from speedladder.config.run import RunConfig
from speedladder.data.batches import BatchStream
from speedladder.data.corpus import Corpus, check_ids, load_corpus, token_dtype
from speedladder.errors import UsageError
from speedladder.step.workload import prepare

FAST = ["--preset", "tiny", "--device", "cpu", "--rungs", "eager,bf16", "--no-profile", "--window-steps", "2",
        "--loss-steps", "4", "--learns-steps", "0"]


def write_ids(path: Path, ids, dtype=np.uint16) -> Path:
    np.asarray(ids, dtype=dtype).tofile(path)
    return path


def test_a_token_file_is_mapped_and_gives_the_batches_a_tensor_gives(tmp_path):
    ids = np.random.default_rng(0).integers(0, 28, 10_000).astype(np.uint16)
    corpus = load_corpus(str(write_ids(tmp_path / "t.bin", ids)), "ids")
    assert isinstance(corpus.tokens, np.memmap) and corpus.tokens.dtype == np.uint16 and corpus.n_tokens == 10_000
    in_memory = Corpus("t", "ids", 28, torch.from_numpy(ids.astype(np.int64)))
    mapped, held = BatchStream(corpus, 4, 32, CPU, seed=3), BatchStream(in_memory, 4, 32, CPU, seed=3)
    for _ in range(3):
        (x, y), (x2, y2) = mapped.next_host(), held.next_host()
        assert x.dtype == torch.long and torch.equal(x, x2) and torch.equal(y, y2)
        assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one


@pytest.mark.slow
def test_a_token_file_climbs_and_is_recorded(tmp_path):
    path = write_ids(tmp_path / "train.bin", np.random.default_rng(1).integers(0, 28, 50_000))
    assert main(["run", *FAST, "--data", str(path), "--quiet", "--out", str(tmp_path / "runs")]) == 0
    work = prepare(RunConfig(preset="tiny", device="cpu", data=str(path)))
    assert work.corpus.tokenizer == "ids" and work.corpus.vocab_size == 28 == work.model.vocab_size  # the model's


def test_uint32_ids_above_65535(tmp_path):
    assert token_dtype(65535) == np.uint16 and token_dtype(65536) == np.uint32
    path = write_ids(tmp_path / "big.bin", np.arange(0, 70_000, 7), np.uint32)
    corpus = load_corpus(str(path), "ids", vocab_size=70_000)
    assert corpus.tokens.dtype == np.uint32 and int(corpus.tokens[-1]) == 69_993
    check_ids(corpus, 70_000)  # every id below the vocabulary: no error
    with pytest.raises(UsageError, match="id 50001 at position 7,143"):  # the first at or above 50,000
        check_ids(corpus, 50_000)


@pytest.mark.parametrize("make, args, message", [
    (lambda p: p.write_bytes(b"\x01" * 1001), [], "not a whole number of uint16 ids"),
    (lambda p: p.write_bytes(b"\x01" * 4002), ["--vocab-size", "70000"], "not a whole number of uint32 ids"),
    (lambda p: write_ids(p, [1]), [], "need at least 2"),
    (lambda p: write_ids(p, range(20)), [], "more than the corpus"),
    (lambda p: write_ids(p, [3] * 5000 + [40] + [3] * 5000), [], "id 40 at position 5,000"),
    (lambda p: None, [], "token file not found"),
])
def test_bad_token_files_are_one_line_and_exit_2(make, args, message, tmp_path, capsys):
    path = tmp_path / "data.bin"
    make(path)
    assert main(["run", *FAST, "--data", str(path), *args, "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # refused before any run folder


def test_the_id_check_reads_the_file_in_chunks(tmp_path):
    ids = np.full(100_000, 5, dtype=np.uint16)
    ids[77_777] = 30
    corpus = load_corpus(str(write_ids(tmp_path / "t.bin", ids)), "ids")
    with pytest.raises(UsageError, match="id 30 at position 77,777"):
        check_ids(corpus, 28, chunk=1000)  # the offending id sits in chunk 77 of 100
    check_ids(corpus, 31, chunk=1000)


RSS = textwrap.dedent("""
    import re, sys
    from speedladder.cli import main

    def hwm():  # the process's peak resident memory so far
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024

    small, big, out, *args = sys.argv[1:]
    assert main(["run", *args, "--data", small, "--quiet", "--out", out]) == 0
    before = hwm()
    assert main(["run", *args, "--data", big, "--quiet", "--out", out]) == 0
    print(before, hwm())
""")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc (Linux)")
def test_a_200_million_token_file_runs_with_bounded_resident_memory(tmp_path):
    """The same climb on a 2,000-token file, then on a 200-million-token one (400 MB) in the same process: the
    peak resident memory may grow by less than 200 MB (reading the file whole would add 400 MB, 1.6 GB as int64)."""
    small = write_ids(tmp_path / "small.bin", np.random.default_rng(2).integers(0, 28, 2_000))
    big = tmp_path / "big.bin"
    rng = np.random.default_rng(3)
    with open(big, "wb") as f:
        for _ in range(20):  # 10 million ids at a time
            rng.integers(0, 28, 10_000_000, dtype=np.uint16).tofile(f)
    assert big.stat().st_size == 400_000_000
    proc = subprocess.run([sys.executable, "-c", RSS, str(small), str(big), str(tmp_path / "runs"), *FAST],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = map(int, proc.stdout.split()[-2:])
    assert after - before < 200 * 2**20, f"grew by {(after - before) / 2**20:.0f} MiB"
