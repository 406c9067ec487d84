"""The demo fleet's benchmark text, ``datasets/sharegpt-demo.json`` (``fleet.DEMO_DATASET``): what this writes.

SGLang's serving benchmark draws its ``random`` prompts from a ShareGPT-format file on the host (reference
sglang.md §3): the simulated fleet needs one, offline, and the real ShareGPT dump is large and not ours to
ship. This makes a small one from a seeded mix of topics, questions and answers: real text of varied
length, the same file every time. ``python -m orchestrator.sandbox.demo_dataset`` rewrites it; a unit test
checks that the checked-in file is exactly what this writes.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

from orchestrator.sandbox.fleet import DEMO_DATASET

COUNT, SEED = 1024, 2026

TOPICS = (
    "a birthday poem", "a budget for a trip to Lisbon", "a cover letter", "a haiku about autumn", "a job interview",
    "a marathon training plan", "a polite complaint email", "a short story opening", "a sourdough starter",
    "a vegetarian lasagna", "binary search", "black holes", "caring for a cat", "climate and weather",
    "composting at home", "garbage collection", "GPU memory", "index funds", "learning the guitar",
    "photosynthesis", "Rust ownership", "solar panels", "SQL joins", "TCP handshakes", "the French Revolution",
    "the history of jazz", "the Pythagorean theorem", "the Roman aqueducts", "the water cycle",
    "unit tests in Python",
)  # fmt: skip
LEADS = (
    "", "", "", "Quick question: ", "A colleague asked me this: ", "For a short talk: ", "In plain words, ",
    "Briefly, ", "As a checklist: ", "From experience, ", "Step by step: ", "For my notes: ", "Honestly, ",
    "In one paragraph: ", "For a newcomer: ",
)  # fmt: skip
ASKS = (
    "Can you explain {t} in simple terms?",
    "Give me three tips about {t}, with one example each.",
    "What are common mistakes with {t}?",
    "Write a short guide to {t}.",
    "I am confused about {t}. Walk me through it step by step.",
    "Summarize the key ideas of {t} for a beginner.",
)
STYLES = (
    "",
    "Compare it with something from everyday life.",
    "Use a friendly tone.",
    "Keep it under two hundred words.",
    "Add a small example at the end.",
    "Assume I know nothing yet.",
)
ANSWERS = (
    "Here is a short overview of {t}. The core idea is simple, but the details matter: the order of the steps, "
    "the inputs you start from, and how you check the result. Most mistakes come from skipping the check.",
    "Sure. {T} comes down to a few ideas. First, start from what you already know and build one step at a time. "
    "Second, check each step with a small example before moving on. Third, write down what surprised you, "
    "because that is usually where the real understanding is.",
    "Good question. People often get {t} wrong by rushing. Slow down, name each part, and ask what would happen "
    "if one part were missing. That question explains why each part is there.",
)
FOLLOW_UP = (
    "Thanks. Can you give one more example?",
    "Of course: think of {t} as a recipe you repeat until it feels natural.",
)


def _sentence(text: str) -> str:
    """``text`` with its first letter capitalised (a question after no lead starts a sentence)."""
    return text[:1].upper() + text[1:]


def conversations(count: int = COUNT, seed: int = SEED) -> list[dict[str, Any]]:
    """``count`` ShareGPT conversations (a question and its answer, a third of them with one more turn)."""
    rng = random.Random(seed)
    made = []
    for i in range(count):
        topic = rng.choice(TOPICS)
        lead, ask, style = rng.choice(LEADS), rng.choice(ASKS), rng.choice(STYLES)
        question = ask.format(t=topic)
        if lead:  # the question goes on the lead's sentence ("I" stays "I")
            question = lead + (question if question.startswith("I ") else question[:1].lower() + question[1:])
        turns = [" ".join(filter(None, [question, style])), rng.choice(ANSWERS).format(t=topic, T=_sentence(topic))]
        if rng.random() < 1 / 3:
            turns += [FOLLOW_UP[0], FOLLOW_UP[1].format(t=topic)]
        said = [{"from": "human" if n % 2 == 0 else "gpt", "value": text} for n, text in enumerate(turns)]
        made.append({"id": f"orch-demo-{i:03d}", "conversations": said})
    return made


def render() -> str:
    """The file's text: indented JSON, one trailing newline."""
    return json.dumps(conversations(), indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    DEMO_DATASET.write_text(render(), encoding="utf-8")
    sys.stdout.write(f"wrote {DEMO_DATASET} ({COUNT} conversations)\n")
