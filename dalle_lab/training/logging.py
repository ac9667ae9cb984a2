"""What a run shows: a console progress bar (loss, text loss, image loss, lr, tokens/s, time left) and, when asked,
wandb. Only rank 0 logs. wandb is imported only when a run name is given; its own environment variables
(WANDB_MODE=offline / disabled, WANDB_DIR) are honoured as wandb documents them.
"""
from __future__ import annotations

import math
import sys
import time

from dalle_lab.utils import open_wandb

from dalle_lab.image_grid import to_uint8


def format_seconds(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class RunLogger:
    def __init__(self, enabled: bool, progress: bool = True, wandb_name: str | None = None,
                 wandb_entity: str | None = None, wandb_project: str = "dalle_lab", wandb_run_id: str | None = None,
                 config: dict | None = None, metrics_path=None):
        self.enabled = enabled
        self.metrics_path = metrics_path  # one JSON line per logged step, appended (a resumed run continues it)
        self.progress = progress and enabled
        self.bar = None
        self.wandb_run = None
        self.started = time.monotonic()
        if enabled and wandb_name:
            self.wandb_run = open_wandb(wandb_name, wandb_entity, wandb_project, wandb_run_id, config)

    def cut_metrics_back(self, step: int) -> None:
        """A resumed run starts after `step`: drop the lines a crashed run logged past its last checkpoint, so
        every step appears once (the file is rewritten atomically)."""
        import json
        from pathlib import Path

        if not self.enabled or self.metrics_path is None or not Path(self.metrics_path).is_file():
            return
        lines = Path(self.metrics_path).read_text(encoding="utf-8").splitlines(keepends=True)
        kept = []
        for line in lines:
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except (ValueError, KeyError, TypeError):
                pass  # a line cut short by the crash
        if kept != lines:
            from dalle_lab.utils import atomic_write

            atomic_write(self.metrics_path, lambda tmp: Path(tmp).write_text("".join(kept), encoding="utf-8"))

    @property
    def wandb_run_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None

    def start(self, start_step: int, total_steps: int | None) -> None:
        if self.progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                            file=sys.stderr, smoothing=0.1)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def log(self, step: int, metrics: dict, time_left: float | None = None) -> None:
        if not self.enabled:
            return
        shown = (f"loss {metrics['loss']:.3f} text {metrics['loss_text']:.3f} img {metrics['loss_img']:.3f} "
                 f"lr {metrics['lr']:.2e} {metrics['tokens_per_s']:.0f} tok/s left {format_seconds(time_left)}")
        if self.bar is not None:
            self.bar.set_postfix_str(shown, refresh=False)
        else:  # no bar (--no-progress, logs to a file): one line per logged step
            print(f"step {step}: {shown}", file=sys.stderr, flush=True)
        if self.metrics_path is not None:
            import json
            from pathlib import Path

            Path(self.metrics_path).parent.mkdir(parents=True, exist_ok=True)
            with open(self.metrics_path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"step": step, **metrics}) + "\n")
        # A resumed run recomputes, bit for bit, the steps its interrupted predecessor logged after the last
        # checkpoint; wandb already holds those (it accepts each step once), so they are not sent again.
        if self.wandb_run is not None and step >= getattr(self.wandb_run, "step", 0):
            self.wandb_run.log(dict(metrics), step=step)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, file=sys.stderr)

    def log_images(self, step: int, images, captions) -> None:
        if self.wandb_run is None:
            return
        import wandb

        self.wandb_run.log({"samples": [wandb.Image(a, caption=c) for a, c in zip(to_uint8(images), captions)]},
                           step=step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None
