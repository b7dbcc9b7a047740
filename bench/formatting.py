"""CPU to format one reply for each platform (gateway/markdown.py's parse and the three renderers).

Three replies of the kind models write: a short answer (about 300 characters, bold, a link,
a code span), a 4,000-character one (headings, nested lists, a quote, two code blocks), and
a 10,000-character one with a long code block, which Telegram splits first and renders part
by part, as the adapter does.  Prints the median CPU microseconds per reply over --rounds.

    .venv/bin/python bench/formatting.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.discord.format import to_discord
from adapters.slack.mrkdwn import to_mrkdwn
from adapters.telegram.format import markdown_to_html
from gateway.formatting import split_message, utf16_len

SHORT = ("**Sure.** Here is the plan, step by step, with `code` and a [link](https://ex.com/docs?a=1&b=2). "
         "It should take *about* ten minutes; ask if anything is unclear. ") * 2
SECTION = """## Step {n}

Before you start, check the *version*: `python --version` should say **3.11** or later.

1. Install the package:
   - with **pip**: `pip install switchboard`
   - or from [the repository](https://github.com/example/switchboard)
2. Write the config, then run it:

```python
config = load("config.yaml")  # a < b and c > d
run(config, timeout=30)
```

> Note: the *first* run creates the database; `--dry-run` shows what it would do.
"""
MEDIUM = "# Setting up\n\n" + "\n".join(SECTION.format(n=n) for n in range(1, 9))
LONG = ("Intro paragraph with **bold** and a [link](https://ex.com).\n\n" + "word " * 600 + "\n\n```python\n"
        + "\n".join(f"    print('line {i:04d}', '{'x' * 50}')" for i in range(100)) + "\n```\n\nDone. " + "tail " * 200)


def telegram_send(text: str) -> None:
    for part in split_message(text, 4096, length=utf16_len):
        markdown_to_html(part)


def cpu_us(fn, text: str, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.process_time_ns()
        fn(text)
        samples.append((time.process_time_ns() - start) / 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    renderers = [("telegram (split + HTML)", telegram_send), ("discord", to_discord), ("slack", to_mrkdwn)]
    print(f"median CPU per reply, µs ({args.rounds} rounds)")
    print(f"{'renderer':<26}{'short ' + str(len(SHORT)):>14}{'medium ' + str(len(MEDIUM)):>16}{'long ' + str(len(LONG)):>16}")
    for name, fn in renderers:
        row = [cpu_us(fn, text, args.rounds) for text in (SHORT, MEDIUM, LONG)]
        print(f"{name:<26}{row[0]:>14.0f}{row[1]:>16.0f}{row[2]:>16.0f}")


if __name__ == "__main__":
    main()
