"""Part 3: embedded data, tokenizers, the fixed-shape batch stream."""

from __future__ import annotations

import hashlib
import socket

import pytest
import torch

from speedladder.data import asset
from speedladder.data.batches import BatchStream
from speedladder.data.corpus import check_fits, load_corpus, load_text
from speedladder.data.tokenizers import CharTokenizer, GPT2Tokenizer
from speedladder.errors import UsageError

# From shared/data/PROVENANCE.md.
CHECKSUMS = {
    "timemachine.txt": (178979, "8424dbd9532ac81f7e5f0b6add90e6952baea29158309d7d1bf3884f4e12c516"),
    "tinyshakespeare.txt": (1115394, "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
    "gpt2.tiktoken": (835554, "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"),
}


@pytest.mark.parametrize("name", sorted(CHECKSUMS))
def test_shipped_files_match_their_checksums(name):
    blob = asset(name).read_bytes()
    size, digest = CHECKSUMS[name]
    assert len(blob) == size
    assert hashlib.sha256(blob).hexdigest() == digest


def test_time_machine_with_d2l_preprocessing():
    corpus = load_corpus("timemachine", "char")
    assert corpus.n_tokens == 170_580
    assert corpus.vocab_size == 28
    assert len(CharTokenizer.symbols) == 28
    # 26 letters and the space occur; the unknown symbol never does after preprocessing.
    assert set(corpus.tokens.tolist()) == set(range(1, 28))


def test_char_tokenizer_preprocessing():
    tok = CharTokenizer()
    assert tok.preprocess("The Time-Machine, 1895!") == "the time machine"
    # As d2l's read_time_machine: each line stripped, lines joined with nothing between them.
    assert tok.preprocess("shone and\ntwinkled, and\n") == "shone andtwinkled and"
    assert tok.decode(tok.encode("Hello, World")) == "hello world"


def test_gpt2_tokenizer_from_shipped_ranks_without_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the tokenizer tried to open a network connection")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    tok = GPT2Tokenizer()
    assert tok.encode("Hello world") == [15496, 995]
    assert len(tok.encode(load_text("tinyshakespeare"))) == 338_025
    assert tok.decode(tok.encode("To be, or not to be")) == "To be, or not to be"


def test_batch_stream_has_one_fixed_shape_and_shifted_targets():
    corpus = load_corpus("timemachine", "char")
    stream = BatchStream(corpus, 8, 32, torch.device("cpu"), seed=0)
    for _ in range(50):
        x, y = next(stream)
        assert x.shape == y.shape == (8, 32)  # never ragged
        assert x.dtype == torch.long
        torch.testing.assert_close(x[:, 1:], y[:, :-1])  # y is x shifted by one token


def test_batch_stream_is_seeded():
    corpus = load_corpus("timemachine", "char")
    a = BatchStream(corpus, 4, 16, torch.device("cpu"), seed=3)
    b = BatchStream(corpus, 4, 16, torch.device("cpu"), seed=3)
    c = BatchStream(corpus, 4, 16, torch.device("cpu"), seed=4)
    xa, xb, xc = next(a)[0], next(b)[0], next(c)[0]
    assert torch.equal(xa, xb)
    assert not torch.equal(xa, xc)


def test_batch_stream_pins_and_copies_asynchronously_only_on_cuda():
    corpus = load_corpus("timemachine", "char")
    assert BatchStream(corpus, 4, 16, torch.device("cuda"), seed=0)._pin
    assert not BatchStream(corpus, 4, 16, torch.device("cpu"), seed=0)._pin


def test_batch_larger_than_corpus_is_refused(tmp_path):
    f = tmp_path / "small.txt"
    f.write_text("a tiny corpus of a few words " * 10)
    corpus = load_corpus(str(f), "char")
    check_fits(corpus, 2, 32)
    with pytest.raises(UsageError, match="more than the corpus"):
        check_fits(corpus, 100, 32)


def test_bad_data_files(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        load_text(str(tmp_path / "missing.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(UsageError, match="empty"):
        load_text(str(empty))
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00\x81 not text")
    with pytest.raises(UsageError, match="not UTF-8"):
        load_text(str(binary))
    digits = tmp_path / "digits.txt"
    digits.write_text("1")
    with pytest.raises(UsageError, match="token"):
        load_corpus(str(digits), "char")
