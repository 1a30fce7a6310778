"""The tiny Qwen3-VL starter: the embedded default's stand-in for an SFT checkpoint.

``build`` makes it from a ``config.StarterConfig`` (tokenizer, processor, model, then
``warmstart``'s solver imitation on the states of ``states``) and ``ensure_starter`` puts it under
the data root; ``shipped`` is the copy that ships as package data (``data/``) with its pinned
digest; ``record`` reads ``starter.json`` without torch (``mazerl build-starter`` is
``cli.build_starter``). Kept light: importing the package imports nothing.
"""
