"""Count the prose words of a chapter's teaching path.

The teaching path is the page up to its ``## Exercises`` heading (the exercises, their
solutions and anything after them are not counted). Prose is the Markdown a reader
reads: code cells, fenced blocks, MyST directive options, HTML comments, front matter
and display math (``$$ ... $$``) are left out; inline code and inline math count as one
word each.

    python3 tools/prose_words.py chapters/*.md        # one line per chapter
    python3 tools/prose_words.py --max 7000 chapters/0[0-3]*.md   # exit 1 if over
    python3 tools/prose_words.py --summary --max 250 chapters/*.md  # the Summaries

Standard library only, so it runs without the book's environment.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

#: The heading that ends a chapter's teaching path.
END_HEADING = re.compile(r"^##\s+Exercises\b")
_FENCE = re.compile(r"^(`{3,}|~{3,})")
_WORD = re.compile(r"[A-Za-z0-9\u00C0-\u024F][\w'’.-]*")


def teaching_path(text: str) -> str:
    """The Markdown prose of ``text`` before ``## Exercises``, code and markup removed."""
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":  # front matter (jupytext header)
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), 0)
        lines = lines[end + 1 :]
    kept: list[str] = []
    fence: str | None = None
    boxes: list[str] = []  # open admonition fences: their bodies are prose
    in_math = False
    for line in lines:
        if fence is None and END_HEADING.match(line):
            break
        m = _FENCE.match(line.strip())
        if fence is not None:
            if m and line.strip().startswith(fence) and line.strip() == fence:
                fence = None
            continue
        if m and boxes and line.strip() == boxes[-1]:
            boxes.pop()  # the end of an admonition
            continue
        if m:
            opener = line.strip()
            # a MyST admonition/box (```{note}, ```{admonition}) holds prose: keep
            # its body, drop its options; a code block or code cell is dropped whole
            if re.match(
                r"^(`{3,}|~{3,})\{(note|tip|important|warning|admonition|"
                r"seealso|attention|caution|hint|margin|sidebar|topic)\}",
                opener,
            ):
                boxes.append(m.group(1))
                continue
            fence = m.group(1)
            continue
        stripped = line.strip()
        if stripped == "$$" or (stripped.startswith("$$") and not in_math):
            in_math = (
                not (stripped.endswith("$$") and len(stripped) > 2) and not in_math
            )
            continue
        if in_math:
            if stripped.endswith("$$"):
                in_math = False
            continue
        if re.match(r"^:[\w-]+:", stripped) or stripped.startswith("+++"):
            continue  # directive options, cell separators
        if stripped.startswith("(") and stripped.endswith(")="):
            continue  # MyST labels
        kept.append(line)
    prose = "\n".join(kept)
    prose = re.sub(r"<!--.*?-->", " ", prose, flags=re.S)
    prose = re.sub(r"`[^`\n]+`", " CODE ", prose)
    prose = re.sub(r"\$[^$\n]+\$", " MATH ", prose)
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # link targets
    prose = re.sub(
        r"\{[\w:-]+\}", " ", prose
    )  # roles ({glue:text}, {ref}) but keep text
    return prose


#: The heading of the section that states a chapter's rules.
SUMMARY_HEADING = re.compile(r"^##\s+Summary\b")
#: The most prose words a Summary may take.
SUMMARY_MAX = 250
#: The most prose words a chapter page's teaching path may take (about).
TEACHING_PATH_MAX = 7000


def count(path: Path) -> int:
    """The number of prose words in the teaching path of the chapter at ``path``."""
    return len(_WORD.findall(teaching_path(path.read_text(encoding="utf-8"))))


def summary(text: str) -> str | None:
    """The prose of the ``## Summary`` section of ``text`` (up to the next ``##``
    heading), counted as in :func:`teaching_path`; None without one."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if SUMMARY_HEADING.match(ln)), None)
    if start is None:
        return None
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
        len(lines),
    )
    return teaching_path("\n".join(lines[start + 1 : end]))


def count_summary(path: Path) -> int | None:
    """The number of prose words in the Summary of the chapter at ``path``."""
    prose = summary(path.read_text(encoding="utf-8"))
    return None if prose is None else len(_WORD.findall(prose))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--max", type=int, default=None, help="exit 1 if any file is over")
    ap.add_argument("--summary", action="store_true", help="count the Summary only")
    ns = ap.parse_args(argv)
    over = False
    for path in ns.files:
        n = (count_summary(path) or 0) if ns.summary else count(path)
        flag = ""
        if ns.max is not None and n > ns.max:
            over, flag = True, f"  (over {ns.max})"
        print(f"{n:6d}  {path}{flag}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
