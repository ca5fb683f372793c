"""A Dockerfile's FROM lines read as Docker reads them: the ARGs declared before the first FROM substituted in every
form Docker documents, over generated names, values and shapes; any text either names its bases or is refused with
the line, never an exception of another kind."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opencode_env.sandbox.local.images.build.dockerfile import DockerfileError, base_images, instructions

NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
IMAGES = st.from_regex(r"[a-z0-9][a-z0-9.-]{0,10}(/[a-z0-9]{1,8}){0,2}(:[a-z0-9.]{1,8})?", fullmatch=True)


@given(name=NAMES, image=IMAGES, form=st.sampled_from(["${{{}}}", "${}", "${{{}:-unused}}"]), quoted=st.booleans())
def test_an_arg_before_from_names_the_base(name: str, image: str, form: str, quoted: bool) -> None:
    default = f'"{image}"' if quoted else image
    dockerfile = f"ARG {name}={default}\nFROM {form.format(name)}\nWORKDIR /app\n"
    assert base_images(dockerfile) == [image]


@given(name=NAMES, image=IMAGES)
def test_a_default_word_stands_in_for_an_arg_without_a_value(name: str, image: str) -> None:
    assert base_images(f"ARG {name}\nFROM ${{{name}:-{image}}}\n") == [image]
    assert base_images(f"ARG {name}=x\nFROM {image}${{{name}:+}}\n") == [image]


@given(name=NAMES)
def test_an_arg_with_no_value_is_refused_by_name_and_line(name: str) -> None:
    with pytest.raises(DockerfileError, match=rf"line 3: \${name} has no value"):
        base_images(f"# a comment\nARG {name}\nFROM ${name}\n")


def test_an_arg_after_the_first_from_does_not_reach_a_later_from() -> None:
    """Docker: an ARG declared inside a stage is that stage's; a FROM sees only the ARGs declared before the first."""
    with pytest.raises(DockerfileError, match=r"line 3: \$LATE has no value"):
        base_images("FROM base:1\nARG LATE=other:2\nFROM $LATE\n")


def test_stages_scratch_flags_and_continuations() -> None:
    dockerfile = (
        "# syntax=docker/dockerfile:1\n"
        "ARG BASE=localhost/opencode-env-base:bookworm VERSION=1\n"
        "FROM --platform=$BUILDPLATFORM \\\n"
        "    ${BASE} AS build\n"
        "FROM scratch AS empty\n"
        "FROM build\n"
        "FROM ${BASE}\n"
    )
    assert base_images(dockerfile) == ["localhost/opencode-env-base:bookworm"]
    assert [i.keyword for i in instructions(dockerfile)] == ["ARG", "FROM", "FROM", "FROM", "FROM"]
    assert instructions(dockerfile)[1].line == 3


@given(st.text(alphabet=st.sampled_from(list("ARGFROM $={}:-+\\\n #abc/.")), max_size=80))
def test_any_text_is_read_or_refused(text: str) -> None:
    refused = ""
    try:
        names = base_images(text)
    except DockerfileError as error:
        refused, names = str(error), []
    assert refused.startswith("Dockerfile line ") or not refused
    assert all(name and "$" not in name for name in names)
