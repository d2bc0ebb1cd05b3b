"""The prompts a draft head trains on, built offline and deterministically from what the
package registries ship: the standard library's own sources and docstrings, pydoc's topic
texts, and templates in the style of the four seed prompt classes. The seed prompts
themselves are left out: they are what the head is measured on.

The corpus depends on the seed and on the Python that reads the standard library; the recipe
records both and the corpus's sha256.
"""

from __future__ import annotations

import ast
import random
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gridbench.errors import ConfigError

# each class's share of the prompts; within code and prose, the share of each source
CLASS_SHARES = {"code": 0.35, "prose": 0.30, "reasoning": 0.175, "dialogue": 0.175}
_CODE_EXPLAIN_SHARE = 0.7  # of code: explain a stdlib function; the rest write one from its docstring
_PROSE_SUMMARY_SHARE = 0.5  # of prose: summarise a stdlib text; the rest are essays


@dataclass(frozen=True)
class TrainingPrompt:
    id: int
    prompt_class: str
    source: str  # where its text came from: a stdlib function or text, or "template"
    text: str


TOPICS = (
    "the invention of the printing press",
    "the history of the bicycle",
    "how bees make honey",
    "the role of libraries in a city",
    "the first transatlantic telegraph cable",
    "why the sky is blue",
    "the history of coffee",
    "the life cycle of a star",
    "the importance of sleep",
    "how vaccines work",
    "the Silk Road",
    "the history of chess",
    "the origins of the Olympic Games",
    "how rainbows form",
    "the history of photography",
    "the water cycle",
    "the invention of the telephone",
    "the history of the piano",
    "urban gardening",
    "the Apollo 11 mission",
    "the history of the internet",
    "how volcanoes erupt",
    "the benefits of learning a second language",
    "the history of cinema",
    "the Renaissance in Florence",
    "the migration of monarch butterflies",
    "the history of paper money",
    "how glaciers shape landscapes",
    "the rise of public transport",
    "the history of the blues",
    "the invention of the steam engine",
    "coral reefs",
    "the history of the English language",
    "how the human heart works",
    "the Great Wall of China",
    "the history of tea in Britain",
    "the impact of the radio on society",
    "the history of maps",
    "renewable energy",
    "the history of rock and roll",
    "the work of Marie Curie",
    "how computers store numbers",
    "the history of the Roman roads",
    "the culture of street food",
)
ESSAY_FORMS = (
    "Write a detailed 300-word essay about {t}.",
    "Write a short article about {t}.",
    "Write an informative essay about {t} for a general audience.",
    "Explain {t} to a curious twelve-year-old.",
    "Write a blog post about {t}.",
    "Describe {t} in five paragraphs.",
)
NAMES = (
    ("Alice", "Bob"),
    ("Maria", "Tom"),
    ("Sam", "Priya"),
    ("Leo", "Nina"),
    ("Kate", "Omar"),
    ("Ben", "Yuki"),
    ("Eva", "Raj"),
    ("Mia", "Jack"),
)
OPENERS = (
    "Did you finish the book I lent you?",
    "Are you coming to the concert on Friday?",
    "I think I finally fixed the bug in my code.",
    "Have you tried the bakery on Main Street?",
    "Do you want to go hiking this weekend?",
    "I can't decide which laptop to buy.",
    "How was your first day at the new job?",
    "Have you seen the weather forecast for tomorrow?",
    "I started learning to play the guitar.",
    "Did you watch the match last night?",
    "My cat knocked over the plant again.",
    "What are you cooking for dinner?",
    "I'm thinking about visiting Japan next spring.",
    "The train was late again this morning.",
    "Can you help me move on Saturday?",
    "I signed up for a pottery class.",
    "Did you hear the museum is free on Sundays?",
    "I lost my keys somewhere in the park.",
)
AUDIENCES = ("", " Keep it simple.", " Write for engineers.", " Use short paragraphs.")
DIALOGUE_FORMS = (
    "Continue this conversation naturally. Keep each speaker's turn short. {a}: '{o}' {b}:",
    "Write a friendly chat between {a} and {b} that starts with {a} saying: '{o}'",
    "{a} says to {b}: '{o}' Write {b}'s reply and how the conversation goes on.",
)


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "idlelib", "tkinter", "turtledemo", "lib2to3", "site-packages", "ensurepip"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def _functions_and_texts(files: list[Path]) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    """(name, source, first docstring line) of short functions, and (name, paragraph) of docstrings."""
    functions, texts = [], []
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        module = path.stem
        for paragraph in re.split(r"\n\s*\n", ast.get_docstring(tree) or ""):
            flat = " ".join(paragraph.split())
            if 250 <= len(flat) <= 900:
                texts.append((f"{module}.__doc__", flat))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("__") or node.end_lineno is None:
                continue
            body = lines[node.lineno - 1 : node.end_lineno]
            text = "\n".join(body)
            if 4 <= len(body) <= 28 and len(text) < 1400:
                indent = len(body[0]) - len(body[0].lstrip())
                dedented = "\n".join(line[indent:] for line in body)
                doc = (ast.get_docstring(node) or "").splitlines()
                functions.append((f"{module}.{node.name}", dedented, doc[0] if doc else ""))
    return functions, texts


def _pydoc_texts() -> list[tuple[str, str]]:
    from pydoc_data import topics

    texts = []
    for key in sorted(topics.topics):
        for paragraph in re.split(r"\n\s*\n", topics.topics[key]):
            flat = " ".join(paragraph.split())
            if 300 <= len(flat) <= 900 and not flat.startswith(("*", "|", ">>>")):
                texts.append((f"pydoc_data.topics[{key}]", flat))
    return texts


def _reasoning(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.choice(
            (("Berlin", "Hamburg"), ("Madrid", "Seville"), ("Rome", "Naples"), ("Boston", "New York"))
        )
        distance, v1, v2, hour = (
            rng.randrange(200, 700, 10),
            rng.randrange(60, 120, 5),
            rng.randrange(60, 120, 5),
            rng.randrange(7, 11),
        )
        return (
            f"Let's think step by step. A car leaves {a} at {hour}am driving {v1} km/h towards {b}, "
            f"which is {distance} km away. A second car leaves {b} at {hour + 1}am driving {v2} km/h "
            f"towards {a}. When and where do they meet? Show all working."
        )
    if kind == 1:
        n, price, discount = rng.randrange(3, 12), rng.randrange(2, 9), rng.randrange(2, 6)
        return (
            f"Let's think step by step. A shop sells notebooks for ${price} each. Emma buys {n} notebooks "
            f"and gets a discount of ${discount} on the total. How much does she pay? Explain your reasoning."
        )
    if kind == 2:
        width, length = rng.randrange(3, 20), rng.randrange(5, 30)
        return (
            f"Solve step by step: a rectangular garden is {width} m wide and {length} m long. A path 1 m "
            "wide runs around the outside of the garden. What is the area of the path?"
        )
    if kind == 3:
        age, gap, years = rng.randrange(5, 15), rng.randrange(20, 35), rng.randrange(2, 10)
        return (
            f"Let's think step by step. A mother is {gap} years older than her son, who is {age} now. "
            f"How old will each of them be in {years} years, and what will the ratio of their ages be then?"
        )
    fill, extra = rng.randrange(2, 9), rng.randrange(2, 7)
    return (
        f"Work it out step by step: a tap fills a tank in {fill} hours and a drain empties it in "
        f"{fill + extra} hours. If both are open, how long does it take to fill the tank?"
    )


def _unique(candidates: Iterator[tuple[str, str]], count: int, kind: str) -> list[tuple[str, str]]:
    """The first ``count`` distinct texts of candidates; a ConfigError when there are fewer."""
    if count == 0:
        return []
    seen: dict[str, str] = {}
    for source, text in candidates:
        seen.setdefault(text, source)
        if len(seen) == count:
            return [(source, text) for text, source in seen.items()]
    raise ConfigError(
        f"the draft corpus has only {len(seen)} distinct {kind} prompts, {count} were asked for",
        hint="lower the draft's prompts, or let its prompts repeat by training more epochs",
    )


def _code_explain(functions: list[tuple[str, str, str]]) -> Iterator[tuple[str, str]]:
    for name, source, _doc in functions:
        yield name, f"Explain what this Python function does:\n\n```python\n{source}\n```"


def _code_write(functions: list[tuple[str, str, str]]) -> Iterator[tuple[str, str]]:
    for name, _source, doc in functions[::-1]:
        if 20 < len(doc) < 120:
            yield name, f"Write a Python function with type hints and a docstring for this task: {doc}"


def _summary(texts: list[tuple[str, str]], rng: random.Random) -> Iterator[tuple[str, str]]:
    verbs = (
        "Summarize this text in two sentences",
        "Explain this passage in simple words",
        "Summarize the main points of this text",
    )
    for name, paragraph in texts:
        yield name, f"{rng.choice(verbs)}:\n\n{paragraph}"


def _essay(rng: random.Random) -> Iterator[tuple[str, str]]:
    forms = [(t, f, a) for t in TOPICS for f in ESSAY_FORMS for a in AUDIENCES]
    rng.shuffle(forms)
    for topic, form, audience in forms:
        yield "template", form.format(t=topic) + audience


def _reasonings(rng: random.Random, tries: int) -> Iterator[tuple[str, str]]:
    for _ in range(tries):
        yield "template", _reasoning(rng)


def _dialogue(rng: random.Random) -> Iterator[tuple[str, str]]:
    turns = [(a, b, o, f) for a, b in NAMES for o in OPENERS for f in DIALOGUE_FORMS]
    turns += [(b, a, o, f) for a, b, o, f in turns]
    rng.shuffle(turns)
    for a, b, opener, form in turns:
        yield "template", form.format(a=a, b=b, o=opener)


def build_prompts(count: int, seed: int, exclude: set[str]) -> list[TrainingPrompt]:
    """``count`` distinct prompts, the classes in CLASS_SHARES's proportions, shuffled by ``seed``;
    none of ``exclude`` (the evaluation prompts)."""
    rng = random.Random(seed)
    functions, module_texts = _functions_and_texts(_stdlib_files())
    texts = _pydoc_texts() + module_texts
    rng.shuffle(functions)
    rng.shuffle(texts)
    per_class = {name: round(count * share) for name, share in CLASS_SHARES.items()}
    per_class["code"] += count - sum(per_class.values())
    explain = round(per_class["code"] * _CODE_EXPLAIN_SHARE)
    summaries = round(per_class["prose"] * _PROSE_SUMMARY_SHARE)
    # (class, candidates, how many, what they are): drawn lazily, in this order, from one rng
    sources = (
        ("code", _code_explain(functions), explain, "code-explaining"),
        ("code", _code_write(functions), per_class["code"] - explain, "code-writing"),
        ("prose", _summary(texts, rng), summaries, "summary"),
        ("prose", _essay(rng), per_class["prose"] - summaries, "essay"),
        ("reasoning", _reasonings(rng, 100 * count + 100), per_class["reasoning"], "reasoning"),
        ("dialogue", _dialogue(rng), per_class["dialogue"], "dialogue"),
    )
    chosen = [
        (prompt_class, source, text)
        for prompt_class, candidates, wanted, kind in sources
        for source, text in _unique(((s, t) for s, t in candidates if t not in exclude), wanted, kind)
    ]
    rng.shuffle(chosen)
    return [TrainingPrompt(id=i, prompt_class=c, source=s, text=t) for i, (c, s, t) in enumerate(chosen)]
