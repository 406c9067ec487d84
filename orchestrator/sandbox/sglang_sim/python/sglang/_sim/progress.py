"""tqdm-like progress bars on stderr (``\\r`` updates, a newline when closed)."""

import sys
import time

_BLOCKS = " ▏▎▍▌▋▊▉█"


def _clock(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes:02d}:{seconds:02d}"


def _bar(fraction, width=10):
    filled = fraction * width
    full = int(filled)
    partial = _BLOCKS[int((filled - full) * 8)] if full < width else ""
    return ("█" * full + partial).ljust(width)


class Bar:
    """``for item in Bar(items, desc=...)`` prints ``desc:  40%|████      | 2/5 [00:00<00:00, 1.23it/s]``."""

    def __init__(self, items, desc="", mininterval=0.1):
        self.items = list(items)
        self.desc = desc
        self.mininterval = mininterval
        self.start = self.last_draw = time.monotonic()

    def __iter__(self):
        self._draw(0)
        for done, item in enumerate(self.items, start=1):
            yield item
            if done == len(self.items) or time.monotonic() - self.last_draw >= self.mininterval:
                self._draw(done)
        sys.stderr.write("\n")
        sys.stderr.flush()

    def _draw(self, done):
        self.last_draw = time.monotonic()
        total = len(self.items) or 1
        elapsed = time.monotonic() - self.start
        rate = done / elapsed if elapsed > 0 and done else 0.0
        remaining = (total - done) / rate if rate else 0.0
        prefix = f"{self.desc}: " if self.desc else ""
        line = (f"{prefix}{100 * done / total:3.0f}%|{_bar(done / total)}| {done}/{len(self.items)} "
                f"[{_clock(elapsed)}<{_clock(remaining)}, {rate:.2f}it/s]")
        sys.stderr.write("\r" + line)
        sys.stderr.flush()
