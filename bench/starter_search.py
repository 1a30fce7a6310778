"""Choose a starter: one warm-start, probed and saved at several checkpoints along the way.

    python bench/starter_search.py --out /tmp/starters/e2 --checkpoints 5 --config '{"epochs": 2.0}'

The build is ``mazerl.starter.build.build_starter`` with the given StarterConfig overrides. At each
of ``checkpoints`` points of the warm-start (and at its end) the model is probed
(``bench/starter_probe.py``: greedy success on the 256 held-out mazes, the solver's probability at
first wrong states) and saved as a complete model directory ``<out>/step_<N>`` that training can
start from, so the checkpoint to ship is chosen by what GRPO needs (mistakes that are near-ties,
success around 35-45%) rather than by where the schedule happened to end. ``<out>/probe.jsonl``
gets one line per checkpoint.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.starter_probe import probe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("--config", default="{}", help="StarterConfig overrides (JSON)")
    args = parser.parse_args()
    import torch

    from mazerl.starter.build import build_starter
    from mazerl.starter.config import StarterConfig
    from mazerl.starter.record import RECORD_FILE

    config = StarterConfig(**json.loads(args.config))
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "probe.jsonl"

    def measure(model, processor, step: int, epoch: float) -> dict[str, float]:
        threads = torch.get_num_threads()
        deterministic = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(False)
        try:
            result = probe(model, processor, config.history_images, config.history_text, cache_vision=False)
        finally:
            torch.use_deterministic_algorithms(deterministic)
            torch.set_num_threads(threads)
        target = args.out / f"step_{step:05d}"
        model.save_pretrained(target)
        processor.save_pretrained(target)
        (target / RECORD_FILE).write_text(json.dumps({"name": target.name, "config": config.model_dump(mode="json")}))
        line = {"step": step, "epoch": epoch, **result}
        with log.open("a") as handle:
            handle.write(json.dumps(line) + "\n")
        print(f"probe: {json.dumps(line)}", flush=True)
        return result

    final = args.out / "final"
    shutil.rmtree(final, ignore_errors=True)
    build_starter(
        final, config, log=lambda text: print(text, flush=True), on_checkpoint=measure, checkpoints=args.checkpoints
    )
    # The processor files and generation config as the finished build wrote them (the same for every step).
    for step_dir in sorted(args.out.glob("step_*")):
        for path in final.iterdir():
            if path.name not in ("model.safetensors", "config.json", RECORD_FILE):
                shutil.copy2(path, step_dir / path.name)


if __name__ == "__main__":
    main()
