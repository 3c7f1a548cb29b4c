"""The errors a model loader raises for input it cannot use: the only exceptions bad model files produce.

* :class:`UnsupportedModelError`: the files describe a model this engine does not run (another
  architecture, a RoPE variant it does not implement).
* :class:`ModelFormatError` (a kind of the former): the files are malformed, truncated or inconsistent;
  the message names the file, the key and the value at fault. ``GGUFError``, ``SafetensorsError`` and
  :class:`TokenizerDataError` (raised when the tokenizer is first needed) are kinds of it.

Tensors stored in a type without kernels raise ``quant.formats.UnsupportedQuantError``.
"""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """The model is not one this engine can run (the message names what it is)."""


class ModelFormatError(UnsupportedModelError):
    """A model file is malformed or inconsistent (the message names the file, the key and the value)."""


class TokenizerError(ValueError):
    """The tokenizer cannot do what was asked (a chat role, a token id), or its data are bad."""


class TokenizerDataError(ModelFormatError, TokenizerError):
    """A model's tokenizer data are missing or invalid (the message names the file and why)."""


__all__ = ["ModelFormatError", "TokenizerDataError", "TokenizerError", "UnsupportedModelError"]
