"""The evaluation text (a public-domain English text shipped in the package) and prompts taken from it."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
TEXTS = {
    "kjv": DATA / "kjv_ruth_joseph.txt",  # KJV Ruth 1-4 + Genesis 37-41 (provenance: kjv_ruth_joseph.md)
    "declaration": DATA / "declaration.txt",  # the US Declaration of Independence
}
DEFAULT_TEXT = "kjv"


def load_text(name_or_path: str = DEFAULT_TEXT) -> tuple[str, str]:
    """``(text, label)`` of a bundled text (``kjv``, ``declaration``) or of a UTF-8 file path."""
    path = TEXTS.get(name_or_path, Path(name_or_path))
    if not path.is_file():
        raise ValueError(
            f"evaluation text {name_or_path!r}: no such bundled text ({', '.join(TEXTS)}) or file"
        )
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise ValueError(f"evaluation text {path} is empty")
    return text, name_or_path if name_or_path in TEXTS else str(path)


def eval_tokens(tokenizer, text: str, n_tokens: int) -> list[int]:
    """The first ``n_tokens`` tokens of ``text`` (BOS first, as the model's metadata says)."""
    if n_tokens < 2:
        raise ValueError(f"evaluation needs at least 2 tokens, got {n_tokens}")
    ids = tokenizer.encode(text)
    if len(ids) < n_tokens:
        raise ValueError(f"the evaluation text has {len(ids)} tokens, fewer than the {n_tokens} asked for")
    return ids[:n_tokens]


def prompts_from_text(text: str, n: int, words: int = 12) -> list[str]:
    """``n`` prompts: the first ``words`` words of successive paragraphs (cycling if there are fewer)."""
    paragraphs = [p.split() for p in text.split("\n\n") if len(p.split()) >= words]
    if not paragraphs:
        raise ValueError(f"the text has no paragraph of {words} words to take prompts from")
    return [" ".join(paragraphs[i % len(paragraphs)][:words]) for i in range(n)]
