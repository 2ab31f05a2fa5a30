"""The docs harness's own rules, on small pages of its own: a block that is
neither run, data nor marked fails; a skip needs a reason; an output block
is compared (masked) and a wrong one fails; a failing block fails.

Run by ``make test-docs`` before the harness runs the real docs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import docs_test  # noqa: E402

PAGES = docs_test.ROOT / "build" / "docs-test-selftest"


@pytest.fixture
def page():
    PAGES.mkdir(parents=True, exist_ok=True)
    made: List[Path] = []

    def write(name: str, text: str) -> Path:
        p = PAGES / name
        p.write_text(text)
        made.append(p)
        return p

    yield write
    for p in made:
        shutil.rmtree(docs_test.scratch_dir(p), ignore_errors=True)
        p.unlink(missing_ok=True)


def counts(p: Path):
    failures: List[str] = []
    env = docs_test.make_env(docs_test.ROOT / "build" / "test-prefix", None, sys.executable, PAGES)
    c = docs_test.test_page(p, env, sys.executable, failures)
    return c, failures


FENCE = "```"


def test_each_kind_is_counted(page):
    p = page(
        "kinds.md",
        f"""
{FENCE}sh
echo "took 1.25 s, 512 MiB, pid 4242"
{FENCE}

<!-- docs-test: output -->
{FENCE}text
took 3.5 s, 7 MiB, pid 1
{FENCE}

<!-- docs-test: skip: needs a GPU -->
{FENCE}python
import torch; torch.cuda.init()
{FENCE}

{FENCE}json
{{"a": [1, 2, "..."]}}
{FENCE}
""",
    )
    c, failures = counts(p)
    assert failures == []
    assert (c.run, c.compared, c.skipped, c.data) == (1, 1, 1, 1)
    assert c.reasons == ["12: needs a GPU"]


def test_a_block_without_language_fails(page):
    c, failures = counts(page("nolang.md", f"{FENCE}\nmake everything\n{FENCE}\n"))
    assert c.failed == 1 and "no language" in failures[0]


def test_an_unknown_language_fails_unless_marked(page):
    c, failures = counts(page("lang.md", f"{FENCE}fortran\nprint *, 1\n{FENCE}\n"))
    assert c.failed == 1 and "neither run nor data" in failures[0]


def test_a_skip_needs_a_reason(page):
    c, failures = counts(page("skip.md", f"<!-- docs-test: skip -->\n{FENCE}sh\nfalse\n{FENCE}\n"))
    assert c.failed == 1 and "needs a reason" in failures[0]


def test_a_wrong_output_fails_with_the_difference(page):
    p = page(
        "out.md",
        f"{FENCE}sh\necho one; echo two\n{FENCE}\n\n<!-- docs-test: output -->\n{FENCE}text\none\nthree\n{FENCE}\n",
    )
    c, failures = counts(p)
    assert c.failed == 1 and "-three" in failures[0] and "+two" in failures[0]


def test_a_failing_block_fails_and_json_must_parse(page):
    p = page("fail.md", f"{FENCE}sh\nexit 3\n{FENCE}\n\n{FENCE}json\n{{not json}}\n{FENCE}\n")
    c, failures = counts(p)
    assert c.failed == 2
    assert "status 3" in failures[0] and "JSON" in failures[1]


def test_a_fragment_needs_a_fixture(page):
    c, failures = counts(page("frag.md", f"{FENCE}c\nmemprobe_source *s;\n{FENCE}\n"))
    assert c.failed == 1 and "needs a fixture" in failures[0]


def test_masking_keeps_words_and_drops_what_varies():
    assert docs_test.mask("  peak   450 MiB  pid 32132 at /tmp/x/y (1 tick missed: behind)") == [
        "peak # MiB pid # at <path>"
    ]
    assert docs_test.mask("  container (cgroup v2) 3 GiB, limit none") == ["<host:container>"]
    assert docs_test.mask("  RAM by kind  at the tree's sampled RAM peak 643 MiB: anon 640 MiB, shmem 0 B") == [
        "<host:RAM>"
    ]
    assert docs_test.mask("x.py:3: NoGPUWarning: none\n  with t:\nkept") == ["kept"]
