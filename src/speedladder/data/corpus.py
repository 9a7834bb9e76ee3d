"""A corpus: an embedded text, a UTF-8 file or a token file, tokenized; its train/val split and the checks on it."""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from speedladder.config.run import VAL_FRACTION, is_token_file
from speedladder.data import asset
from speedladder.data.tokenizers import get_tokenizer
from speedladder.errors import UsageError

EMBEDDED_CORPORA = ("timemachine", "tinyshakespeare")


def load_text(source: str) -> str:
    """Text of an embedded corpus (by name) or of a UTF-8 file (by path)."""
    path = asset(f"{source}.txt") if source in EMBEDDED_CORPORA else Path(source)
    if not path.is_file():
        raise UsageError(f"data file not found: {source} "
                         f"(embedded corpora: {', '.join(EMBEDDED_CORPORA)})")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"data file {source} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise UsageError(f"cannot read data file {source}: {e.strerror}") from None
    if not text.strip():
        raise UsageError(f"data file {source} is empty")
    return text

@dataclass(frozen=True)
class Corpus:
    source: str
    tokenizer: str
    vocab_size: int  # 0 for a token file until the model or --vocab-size gives it
    tokens: torch.Tensor | np.ndarray  # (N,) int64 on the host, or a token file's numpy.memmap (never read whole)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def head(self, n: int) -> torch.Tensor:
        """The first n tokens as an int64 tensor."""
        return torch.as_tensor(np.asarray(self.tokens[:n], dtype=np.int64))


def load_corpus(source: str, tokenizer_name: str, vocab_size: int | None = None) -> Corpus:
    """A text corpus, tokenized; or a token file (FILE.bin), mapped, not read."""
    if is_token_file(source):
        return open_token_file(source, tokenizer_name, vocab_size)
    tok = get_tokenizer(tokenizer_name)
    ids = tok.encode(load_text(source))
    if len(ids) < 2:
        raise UsageError(f"data file {source} has {len(ids)} token(s) after tokenizing; need at least 2")
    return Corpus(source, tok.name, tok.vocab_size, torch.tensor(ids, dtype=torch.long))


SCAN_IDS = 1 << 24  # ids read at a time when a token file is checked: 32 MiB of uint16, whatever the file's size
_DTYPE_HINT = "uint16 ids, uint32 when --vocab-size exceeds 65,535"


def token_dtype(vocab_size: int | None) -> np.dtype:
    """nanoGPT's uint16 ids, or uint32 for a vocabulary that uint16 cannot hold."""
    return np.dtype(np.uint32 if vocab_size and vocab_size > 65535 else np.uint16)


def open_token_file(source: str, tokenizer: str, vocab_size: int | None) -> Corpus:
    """A token file through numpy.memmap: its size is checked here, its ids by `check_ids` once the vocabulary
    is known; nothing is read into memory."""
    path = Path(source)
    if not path.is_file():
        raise UsageError(f"token file not found: {source}")
    dtype, size = token_dtype(vocab_size), path.stat().st_size
    if size % dtype.itemsize:
        raise UsageError(f"token file {source} is {size:,} bytes, not a whole number of {dtype.name} ids "
                         f"({dtype.itemsize} bytes each): {_DTYPE_HINT}")
    n = size // dtype.itemsize
    if n < 2:
        raise UsageError(f"token file {source} holds {n} id(s); need at least 2")
    return Corpus(source, tokenizer, vocab_size or 0, np.memmap(path, dtype=dtype, mode="r", shape=(n,)))


def unmap(tokens: np.ndarray) -> None:
    """Drop this process's mappings of a memory-mapped file's pages; they stay in the page cache.

    Each window drawn maps the whole page-cache folio around it (a megabyte or more on recent Linux), so
    without this the resident memory of a run would grow towards the file's size. It costs no time: a gather
    of 4 windows from a 400 MB file took 40 µs with it, 52 µs without (fewer pages mapped; docs/models.md).
    """
    mapped = getattr(tokens, "_mmap", None)  # numpy.memmap's own mmap object
    if mapped is not None and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED)


def check_ids(corpus: Corpus, vocab_size: int, chunk: int = SCAN_IDS) -> None:
    """Every id of a token file below the vocabulary: the whole file is scanned, `chunk` ids at a time into one
    buffer (plain reads, not the memory map, so the scanned pages do not stay in this process)."""
    if isinstance(corpus.tokens, torch.Tensor):
        return
    dtype = corpus.tokens.dtype
    buf = np.empty(chunk, dtype=dtype)
    pos = 0
    with open(corpus.source, "rb") as f:
        while got := f.readinto(buf.data.cast("B")) // dtype.itemsize:  # buf.data: its memoryview
            ids = buf[:got]
            if int(ids.max()) >= vocab_size:
                i = int(np.argmax(ids >= vocab_size))
                raise UsageError(f"token file {corpus.source} holds id {int(ids[i])} at position {pos + i:,}, at or "
                                 f"above the vocabulary size {vocab_size:,}: give --vocab-size, or check its dtype "
                                 f"({_DTYPE_HINT})")
            pos += got


def unigram_entropy(corpus: Corpus, chunk: int = SCAN_IDS) -> float:
    """Entropy in nats of the corpus's token frequencies: the loss of a model that learns nothing but them.

    A token file is read in chunks with plain reads (not through its memory map), so it never sits in this
    process's memory whole.
    """
    counts = torch.zeros(max(corpus.vocab_size, 1), dtype=torch.float64)

    def add(ids: torch.Tensor) -> None:
        nonlocal counts
        c = torch.bincount(ids.long()).double()
        if c.numel() > counts.numel():
            counts = torch.cat([counts, counts.new_zeros(c.numel() - counts.numel())])
        counts[: c.numel()] += c

    if isinstance(corpus.tokens, torch.Tensor):
        add(corpus.tokens)
    else:
        dtype = corpus.tokens.dtype
        buf = np.empty(chunk, dtype=dtype)
        with open(corpus.source, "rb") as f:
            while got := f.readinto(buf.data.cast("B")) // dtype.itemsize:  # buf.data: its memoryview
                add(torch.from_numpy(buf[:got].astype(np.int64)))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


@dataclass(frozen=True)
class Split:
    """A corpus's training split and its held-out val split, and where the val split came from."""

    train: Corpus
    val: Corpus
    val_from: str  # "the last 10% of timemachine", or "val.bin"


def holdout(corpus: Corpus, val_data: str | None = None, vocab_size: int | None = None) -> Split:
    """The training split and the val split: `val_data` (a file of its own, tokenized as the corpus is), or else
    the corpus's last VAL_FRACTION. The two never overlap: a training window lies wholly in the first part, since
    BatchStream draws from the training split alone. Slices of a tensor or a memory map: nothing is copied."""
    if val_data is None:
        cut = corpus.n_tokens - int(corpus.n_tokens * VAL_FRACTION)
        return Split(dataclasses.replace(corpus, tokens=corpus.tokens[:cut]),
                     dataclasses.replace(corpus, tokens=corpus.tokens[cut:]),
                     f"the last {VAL_FRACTION:.0%} of {corpus.source}")
    if is_token_file(val_data) != is_token_file(corpus.source):
        kind = "a token file (.bin)" if is_token_file(corpus.source) else "text"
        raise UsageError(f"--val-data {val_data} must be {kind}, as --data {corpus.source} is")
    why = same_data(val_data, corpus.source)
    if why:
        raise UsageError(f"--val-data {val_data} is the training data --data {corpus.source} ({why}): a val split "
                         f"must be held out of training; give another file, or leave --val-data out to hold out the "
                         f"last {VAL_FRACTION:.0%} of --data")
    val = load_corpus(val_data, corpus.tokenizer, vocab_size)
    return Split(corpus, val, val_data)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def same_data(a: str, b: str) -> str | None:
    """Why two data sources are one (the same name or file, a link to it, or the same bytes), or None."""
    if a == b:
        return "the same name" if a in EMBEDDED_CORPORA else "the same path"
    pa, pb = (asset(f"{x}.txt") if x in EMBEDDED_CORPORA else Path(x) for x in (a, b))
    if not (pa.is_file() and pb.is_file()):
        return None
    if pa.resolve() == pb.resolve() or pa.samefile(pb):
        return "the same file, through a link" if pa.is_symlink() or pb.is_symlink() else "the same file"
    if pa.stat().st_size == pb.stat().st_size and _digest(pa) == _digest(pb):
        return "the same content: equal sha256"
    return None


def check_val_ids(split: Split, vocab_size: int) -> None:
    """A val file of its own holds ids within the model's vocabulary, as the training file must."""
    if split.val.source != split.train.source:
        try:
            check_ids(split.val, vocab_size)
        except UsageError as e:
            raise UsageError(f"--val-data does not match the vocabulary: {e}") from None


def check_val_size(split: Split, batch_size: int, seq_len: int) -> None:
    """A val split that holds at least one batch: what a command that evaluates needs."""
    if split.val.n_tokens - 1 < batch_size * seq_len:
        raise UsageError(f"the val split ({split.val_from}: {split.val.n_tokens:,} tokens) is too small for one "
                         f"batch of {batch_size} x {seq_len} = {batch_size * seq_len:,} tokens: give --val-data, "
                         "a bigger corpus, or a smaller batch")

def check_fits(corpus: Corpus, batch_size: int, seq_len: int) -> None:
    """A batch must not cover more tokens than the corpus has: it would repeat the corpus within a step."""
    if batch_size * seq_len > corpus.n_tokens - 1:
        raise UsageError(
            f"batch {batch_size} x length {seq_len} = {batch_size * seq_len:,} tokens is more than "
            f"the corpus {corpus.source} holds for training ({corpus.n_tokens - 1:,} usable tokens)")
