"""Harbor task directories read into rollout requests, and task images built offline with podman."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from opencode_env.sandbox.local.images.build import BuiltImage, ImageBuilder, ImageBuildError
from opencode_env.sandbox.local.images.build.builder import TAG_REPOSITORY, context_hash, repository_name
from opencode_env.tasks import HarborTask, TaskFormatError
from opencode_env.tasks.harbor import entrypoint_command, request_from_task_dir
from opencode_env.tasks.task_toml import parse_size_mb
from opencode_env.wire import MAX_FILES
from opencode_env.wire.services import Service

TOML_1_0 = """\
version = "1.0"

[metadata]
author_name = "someone"
difficulty = "easy"
tags = ["trivial"]

[verifier]
timeout_sec = 90.0

[agent]
timeout_sec = 240.0

[environment]
build_timeout_sec = 300.0
cpus = 2
memory_mb = 3072
storage_mb = 5120
"""


def make_task(
    root: Path,
    name: str = "hello-task",
    *,
    toml: str = TOML_1_0,
    instruction: str | None = "Write hello.txt.\n",
    tests: dict[str, str | bytes] | None = None,
    solution: dict[str, str] | None = None,
    environment: dict[str, str] | None = None,
) -> Path:
    task = root / name
    task.mkdir(parents=True)
    (task / "task.toml").write_text(toml)
    if instruction is not None:
        (task / "instruction.md").write_bytes(instruction.encode())
    files = {
        **{f"environment/{k}": v for k, v in (environment or {"Dockerfile": "FROM scratch\n"}).items()},
        **{f"tests/{k}": v for k, v in (tests or {"test.sh": "echo 1 > /logs/verifier/reward.txt\n"}).items()},
        **{f"solution/{k}": v for k, v in (solution or {}).items()},
    }
    for relative, content in files.items():
        path = task / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return task


def test_a_1_0_task_maps_onto_a_request(tmp_path):
    task_dir = make_task(
        tmp_path, tests={"test.sh": "pytest /tests/test_outputs.py\n", "test_outputs.py": "def test(): pass\n"}
    )
    request = HarborTask.from_dir(task_dir).to_request("localhost/img:1", "/app")
    assert request.task_id == "hello-task"
    assert request.instruction == "Write hello.txt.\n"
    assert (request.image, request.workdir) == ("localhost/img:1", "/app")
    assert request.verify == ["bash /tests/test.sh"]
    assert request.verify_files == {
        "/tests/test.sh": "pytest /tests/test_outputs.py\n",
        "/tests/test_outputs.py": "def test(): pass\n",
    }
    assert request.verify_as == "root"
    assert (request.verify_timeout_s, request.agent_timeout_s) == (90.0, 240.0)
    assert (request.cpus, request.memory_mb, request.disk_mb) == (2.0, 3072, 5120)
    assert request.network == "internet"
    assert request.env == {}
    assert request.solution is None
    assert request.files == {}


def test_the_instruction_is_verbatim(tmp_path):
    text = "  Line one\r\nLine two\n\n"
    request = HarborTask.from_dir(make_task(tmp_path, instruction=text)).to_request("img", "")
    assert request.instruction == text


def test_a_1_1_task_with_task_table_verifier_env_and_user(tmp_path):
    toml = """\
schema_version = "1.1"
[task]
name = "org/hello"
description = "say hello"
authors = [{ name = "A", email = "a@example.com" }]
[verifier]
env = { LEVEL = "3", TOKEN = "${HOST_TOKEN}" }
user = "tester"
"""
    task = HarborTask.from_dir(make_task(tmp_path, toml=toml))
    request = task.to_request("img", "")
    assert task.config.version == "1.1"
    assert task.config.task is not None
    assert task.config.task.name == "org/hello"
    assert request.env == {}, "the verifier's env is verify's alone: the agent never sees it"
    assert request.verify_files["/tests/.verifier-env"] == "LEVEL=3\nTOKEN='${HOST_TOKEN}'\n"
    assert request.verify == ["set -a && . /tests/.verifier-env && set +a && bash /tests/test.sh"]
    assert request.verify_as == "grader"
    assert any(note.startswith("[verifier] user = 'tester'") for note in task.unsupported)
    assert any(note.startswith("[verifier] env.TOKEN: the ${...} template") for note in task.unsupported)


@pytest.mark.parametrize("user", ['"root"', "0"])
def test_a_root_verifier_user_is_root(tmp_path, user):
    task = HarborTask.from_dir(make_task(tmp_path, toml=f"[verifier]\nuser = {user}\n"))
    assert task.to_request("img", "").verify_as == "root"
    assert task.unsupported == []


def test_harbor_defaults_apply_when_the_toml_says_nothing(tmp_path):
    task = HarborTask.from_dir(make_task(tmp_path, toml='version = "1.0"\n'))
    request = task.to_request("img", "")
    assert (request.verify_timeout_s, request.cpus, request.memory_mb, request.disk_mb) == (600.0, 1.0, 2048, 10240)
    assert request.agent_timeout_s == 600.0  # Harbor leaves it to the agent: our default
    assert task.unsupported == []


def test_size_strings_map_to_mebibytes_and_win_over_the_mb_fields(tmp_path):
    toml = '[environment]\nmemory_mb = 1024\nmemory = "4G"\nstorage = "512M"\n'
    request = HarborTask.from_dir(make_task(tmp_path, toml=toml)).to_request("img", "")
    assert (request.memory_mb, request.disk_mb) == (4096, 512)


@pytest.mark.parametrize(
    ("text", "mb"), [("4G", 4096), ("512M", 512), ("1.5g", 1536), ("2048K", 2), ("1Gi", 1024), (" 2 GB ", 2048)]
)
def test_parse_size_mb(text, mb):
    assert parse_size_mb(text) == mb


@pytest.mark.parametrize(
    ("toml", "network"),
    [
        ("[environment]\nallow_internet = false\n", "model_only"),
        ("[environment]\nallow_internet = true\n", "internet"),
        ('[environment]\nnetwork_mode = "no-network"\n', "model_only"),
        ('[environment]\nnetwork_mode = "public"\nallow_internet = false\n', "internet"),
    ],
)
def test_network(tmp_path, toml, network):
    assert HarborTask.from_dir(make_task(tmp_path, toml=toml)).to_request("img", "").network == network


def test_an_allow_list_runs_with_internet_and_says_so(tmp_path):
    toml = '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n'
    task = HarborTask.from_dir(make_task(tmp_path, toml=toml))
    assert task.to_request("img", "").network == "internet"
    assert any("allow-lists are not supported" in note for note in task.unsupported)


def test_unknown_and_unsupported_keys_are_kept_and_listed(tmp_path):
    toml = """\
version = "1.0"
flavour = "x"
[environment]
gpus = 1
healthcheck = { command = "true" }
build_timeout_secs = 30
[agent]
user = "agent"
timeout_secs = 10
"""
    task = HarborTask.from_dir(make_task(tmp_path, toml=toml))
    assert task.config.model_extra == {"flavour": "x"}
    assert task.unknown == [
        "flavour: unknown key, ignored",
        "[agent] timeout_secs: unknown key, ignored (did you mean 'timeout_sec'?)",
        "[environment] build_timeout_secs: unknown key, ignored (did you mean 'build_timeout_sec'?)",
    ]
    assert task.unsupported == [
        *task.unknown,
        "[agent] user = 'agent': not supported; the agent runs as the sandbox's user",
        "[environment] gpus = 1: no GPUs are provided",
        "[environment] healthcheck: not run; the agent starts once setup has finished",
    ]


def test_executable_helpers_are_noted(tmp_path):
    task_dir = make_task(tmp_path, tests={"test.sh": "./run.sh\n", "run.sh": "exit 0\n"})
    (task_dir / "tests" / "run.sh").chmod(0o755)
    (task_dir / "tests" / "test.sh").chmod(0o755)
    notes = HarborTask.from_dir(task_dir).unsupported
    assert notes == [
        "/tests/run.sh: the executable bit is not kept (protected files are written as text; run it with its "
        "interpreter)"
    ]


def test_nested_test_files_keep_their_relative_paths(tmp_path):
    tests: dict[str, str | bytes] = {"test.sh": "x\n", "fixtures/data/input.json": "{}\n"}
    task = HarborTask.from_dir(make_task(tmp_path, tests=tests))
    assert sorted(task.verify_files) == ["/tests/fixtures/data/input.json", "/tests/test.sh"]


def test_the_task_id_is_the_directory_name_made_legal(tmp_path):
    task = HarborTask.from_dir(make_task(tmp_path, name="my task (v2)"))
    assert task.task_id == "my-task--v2-"
    assert task.to_request("img", "").task_id == "my-task--v2-"


@pytest.mark.parametrize(
    ("workdir", "expected"), [("", ""), ("/", ""), ("/app", "/app"), ("/workspace/", "/workspace")]
)
def test_the_image_workdir(tmp_path, workdir, expected):
    assert HarborTask.from_dir(make_task(tmp_path)).to_request("img", workdir).workdir == expected


def test_oracle_sends_the_solution(tmp_path):
    toml = '[solution]\nenv = { SOLVE_MODE = "fast" }\n'
    solution = {"solve.sh": "bash /solution/helper.sh\n", "helper.sh": "echo hi > /app/hello.txt\n"}
    task = HarborTask.from_dir(make_task(tmp_path, toml=toml, solution=solution))
    request = task.to_request("img", "/app", oracle=True)
    assert (request.solution, request.solution_as) == (["bash /solution/solve.sh"], "root")
    assert request.files == {
        "/solution/helper.sh": "echo hi > /app/hello.txt\n",
        "/solution/solve.sh": "bash /solution/helper.sh\n",
    }
    assert request.env == {"SOLVE_MODE": "fast"}
    assert "[solution] env: set for every phase of an oracle run" in task.unsupported
    plain = task.to_request("img", "/app")
    assert (plain.solution, plain.files, plain.env) == (None, {}, {})


def test_oracle_without_a_solution_is_an_error(tmp_path):
    task = HarborTask.from_dir(make_task(tmp_path))
    with pytest.raises(TaskFormatError, match=r"solution/solve\.sh: missing"):
        task.to_request("img", "", oracle=True)


def test_oracle_without_a_solution_fails_before_any_build(tmp_path):
    with pytest.raises(TaskFormatError, match=r"solution/solve\.sh: missing"):
        request_from_task_dir(make_task(tmp_path), oracle=True, builder=_NoPodman())


def test_overrides_apply_last(tmp_path):
    task = HarborTask.from_dir(make_task(tmp_path))
    request = task.to_request(
        "img", "", model="m1", base_url="http://127.0.0.1:9/v1", endpoint="vllm", verify_timeout_s=5.0
    )
    assert (request.model, request.base_url, request.endpoint, request.verify_timeout_s) == (
        "m1",
        "http://127.0.0.1:9/v1",
        "vllm",
        5.0,
    )


def test_a_bad_override_is_the_callers_validation_error(tmp_path):
    task = HarborTask.from_dir(make_task(tmp_path))
    with pytest.raises(ValidationError) as caught:
        task.to_request("img", "", not_a_field=1)
    assert not isinstance(caught.value, TaskFormatError)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"instruction": None}, r"instruction\.md: missing"),
        ({"instruction": " \n"}, r"instruction\.md: empty"),
        ({"toml": "version = \n"}, r"task\.toml: not valid TOML"),
        ({"toml": '[environment]\nmemory = "4X"\n'}, r"task\.toml: \[environment\] memory: .*bad size '4X'"),
        ({"toml": '[environment]\nstorage = "lots"\n'}, r"\[environment\] storage: .*bad size 'lots'"),
        ({"toml": "[verifier]\ntimeout_sec = -1\n"}, r"\[verifier\] timeout_sec: .*greater than 0"),
        ({"toml": '[verifier]\nenv = { PATH = "/x" }\n'}, r"\[verifier\] env: .*PATH: reserved"),
        ({"toml": 'version = "2.0"\n'}, r"version: .*'2\.0' is not supported"),
        ({"toml": '[environment]\nnetwork_mode = "mesh"\n'}, r"\[environment\] network_mode"),
        ({"environment": {"README": "no dockerfile\n"}}, r"environment/Dockerfile: missing, and task\.toml sets no"),
        ({"tests": {"run_tests.sh": "x\n"}}, r"tests/test\.sh: missing"),
        ({"tests": {"test.sh": "x\n", "fixture.png": b"\x89PNG\r\n\x1a\n\x00\x00"}}, r"fixture\.png: a binary file"),
        ({"tests": {"test.sh": "x\n", "latin1.txt": b"caf\xe9\n"}}, r"latin1\.txt: a binary file \(not UTF-8"),
    ],
)
def test_format_errors_name_the_file_and_field(tmp_path, change, message):
    with pytest.raises(TaskFormatError, match=message):
        HarborTask.from_dir(make_task(tmp_path, **change))


def test_binary_fixtures_are_refused_with_the_reason(tmp_path):
    tests: dict[str, str | bytes] = {"test.sh": "x\n", "data.bin": b"\x00\x01"}
    with pytest.raises(TaskFormatError) as caught:
        HarborTask.from_dir(make_task(tmp_path, tests=tests))
    assert "data.bin" in str(caught.value)
    assert "binary fixtures are not supported" in str(caught.value)


def test_a_missing_task_toml(tmp_path):
    task_dir = make_task(tmp_path)
    (task_dir / "task.toml").unlink()
    with pytest.raises(TaskFormatError, match=r"task\.toml: missing"):
        HarborTask.from_dir(task_dir)


def test_a_compose_file_it_cannot_run_is_refused_by_file_and_field(tmp_path):
    compose = "services:\n  db:\n    build: db\n    volumes: ['/var/run/docker.sock:/var/run/docker.sock']\n"
    environment = {"Dockerfile": "FROM x\n", "docker-compose.yaml": compose}
    with pytest.raises(TaskFormatError, match=r"docker-compose\.yaml: services\.db\.volumes: nothing of the host"):
        HarborTask.from_dir(make_task(tmp_path, environment=environment))


def test_a_docker_image_needs_no_dockerfile(tmp_path):
    task_dir = make_task(tmp_path, toml='[environment]\ndocker_image = "ghcr.io/org/img:1"\n')
    shutil.rmtree(task_dir / "environment")
    task = HarborTask.from_dir(task_dir)
    assert task.dockerfile is None
    assert task.config.environment.docker_image == "ghcr.io/org/img:1"


def test_too_many_test_files(tmp_path):
    tests: dict[str, str | bytes] = {"test.sh": "x\n", **{f"f{index}.txt": "" for index in range(MAX_FILES)}}
    with pytest.raises(TaskFormatError, match=f"more than {MAX_FILES} files"):
        HarborTask.from_dir(make_task(tmp_path, tests=tests))


def test_a_test_file_over_the_size_limit(tmp_path):
    tests: dict[str, str | bytes] = {"test.sh": "x\n", "big.txt": "a" * 1_000_001}
    with pytest.raises(TaskFormatError, match=r"big\.txt: 1000001 characters, over the limit"):
        HarborTask.from_dir(make_task(tmp_path, tests=tests))


def test_test_files_over_the_total_limit(tmp_path):
    tests: dict[str, str | bytes] = {"test.sh": "x\n", **{f"part{i}.txt": "a" * 1_000_000 for i in range(8)}}
    with pytest.raises(TaskFormatError, match="over 8000000 characters in all"):
        HarborTask.from_dir(make_task(tmp_path, tests=tests))


def test_a_symlink_under_tests_is_refused(tmp_path):
    task_dir = make_task(tmp_path)
    (task_dir / "tests" / "link.txt").symlink_to(task_dir / "instruction.md")
    with pytest.raises(TaskFormatError, match=r"link\.txt: a symbolic link"):
        HarborTask.from_dir(task_dir)


def test_a_workdir_the_request_cannot_carry_is_a_task_error(tmp_path):
    task = HarborTask.from_dir(make_task(tmp_path))
    with pytest.raises(TaskFormatError, match="does not fit a rollout request"):
        task.to_request("img", "/my app")


def test_the_context_hash_covers_paths_contents_and_modes_and_refuses_links(tmp_path):
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM x\n")
    (context / "a.txt").write_text("a\n")
    hashes = [context_hash(context)]
    (context / "a.txt").write_text("b\n")
    hashes.append(context_hash(context))
    (context / "a.txt").chmod(0o755)
    hashes.append(context_hash(context))
    (context / "a.txt").rename(context / "c.txt")
    hashes.append(context_hash(context))
    assert len(set(hashes)) == len(hashes)
    assert context_hash(context) == hashes[-1]
    (context / "link").symlink_to("c.txt")
    with pytest.raises(ImageBuildError, match=r"ctx/link: a symbolic link"):
        context_hash(context)


def test_repository_names_are_legal():
    assert repository_name("My Task_v2") == "my-task-v2"
    assert repository_name("***") == "task"


class _NoPodman(ImageBuilder):
    """A builder that must never be asked anything."""

    def __init__(self) -> None:
        self.podman = "/nonexistent/podman"

    def image_exists(self, ref: str) -> bool:
        raise AssertionError(f"asked about {ref}")


def test_a_missing_podman_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ImageBuildError, match="podman is not installed: apt-get install podman buildah"):
        ImageBuilder()


needs_podman = pytest.mark.skipif(
    shutil.which("podman") is None, reason="podman is not installed (apt-get install podman buildah)"
)


@pytest.fixture
def podman_refs() -> Iterator[list[str]]:
    """Image refs a test created, removed afterwards (newest first: children before their base)."""
    refs: list[str] = []
    yield refs
    for ref in reversed(refs):
        subprocess.run(["podman", "rmi", "--force", ref], capture_output=True, timeout=120, check=False)


@pytest.fixture
def scratch_base(tmp_path, podman_refs) -> str:
    """A one-file base image imported from a tar: no registry, no pull. Its content names its tag, so its image id is
    its own: another test's `podman rmi --force` of an identical image (this suite's or another run's on the machine)
    would remove this one too."""
    ref = f"localhost/opencode-env-test/scratch-base-{uuid.uuid4().hex[:12]}:1"
    archive = tmp_path / "base.tar"
    with tarfile.open(archive, "w") as tar:
        data = f"base {ref}\n".encode()
        info = tarfile.TarInfo("base-marker.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    subprocess.run(["podman", "import", str(archive), ref], check=True, capture_output=True, timeout=120)
    podman_refs.append(ref)
    return ref


@needs_podman
def test_build_is_cached_by_content(tmp_path, scratch_base, podman_refs):
    name = f"harbor-test-{uuid.uuid4().hex[:8]}"
    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {scratch_base}\nWORKDIR /app\nCOPY hello.txt /app/\n")
    (context / "hello.txt").write_text("hello\n")
    builder = ImageBuilder()

    first = builder.build(context, name=name, timeout_s=300)
    podman_refs.append(first.ref)
    assert first.ref == f"{TAG_REPOSITORY}/{name}:{context_hash(context)}"
    assert (first.workdir, first.cached) == ("/app", False)
    assert builder.image_exists(first.ref)
    assert builder.image_workdir(first.ref) == "/app"

    again = builder.build(context, name=name, timeout_s=300)
    assert again == BuiltImage(ref=first.ref, image_id=first.image_id, workdir="/app", cached=True)

    (context / "hello.txt").write_text("hello again\n")
    changed = builder.build(context, name=name, timeout_s=300)
    podman_refs.append(changed.ref)
    assert changed.ref != first.ref
    assert changed.image_id != first.image_id
    assert not changed.cached


@needs_podman
def test_a_missing_base_image_fails_fast_with_podmans_message(tmp_path):
    context = tmp_path / "environment"
    context.mkdir()
    missing = f"localhost/opencode-env-test/absent-{uuid.uuid4().hex[:12]}:1"
    (context / "Dockerfile").write_text(f"FROM {missing}\n")
    with pytest.raises(ImageBuildError, match="image not known"):
        ImageBuilder().build(context, name="absent-base", timeout_s=120)


@needs_podman
def test_request_from_task_dir_builds_the_environment(tmp_path, scratch_base, podman_refs):
    environment = {"Dockerfile": f"FROM {scratch_base}\nWORKDIR /app\nCOPY hello.txt /app/\n", "hello.txt": "hi\n"}
    task_dir = make_task(tmp_path, name=f"harbor-req-{uuid.uuid4().hex[:8]}", environment=environment)
    request = request_from_task_dir(task_dir, model="m1")
    podman_refs.append(request.image)
    assert request.image.startswith(f"{TAG_REPOSITORY}/{task_dir.name}:")
    assert (request.workdir, request.model, request.task_id) == ("/app", "m1", task_dir.name)


@needs_podman
def test_request_from_task_dir_prefers_a_local_docker_image(tmp_path, scratch_base):
    toml = f'[environment]\ndocker_image = "{scratch_base}"\n'
    task_dir = make_task(tmp_path, toml=toml, environment={"Dockerfile": "FROM localhost/never-built/x:1\n"})
    request = request_from_task_dir(task_dir)
    assert (request.image, request.workdir) == (scratch_base, "")


@needs_podman
def test_a_docker_image_absent_locally_without_a_dockerfile(tmp_path):
    absent = f"localhost/opencode-env-test/absent-{uuid.uuid4().hex[:12]}:1"
    task_dir = make_task(tmp_path, toml=f'[environment]\ndocker_image = "{absent}"\n')
    shutil.rmtree(task_dir / "environment")
    with pytest.raises(ImageBuildError, match="never pulled"):
        request_from_task_dir(task_dir)


def test_environment_workdir_and_env_as_harbor_reads_them(tmp_path):
    """`[environment] workdir` wins over the image's WORKDIR; `[environment.env]` is every phase's (the container's),
    `[verifier.env]` verify's alone (written in with the tests, after the agent ran)."""
    toml = """\
schema_version = "1.1"
[environment]
workdir = "/workspace/project"
[environment.env]
PROJECT = "demo"
[verifier.env]
EXPECTED = "it's 42"
"""
    task = HarborTask.from_dir(make_task(tmp_path, toml=toml))
    request = task.to_request("img", "/app")
    assert (request.workdir, request.env) == ("/workspace/project", {"PROJECT": "demo"})
    assert request.verify_files["/tests/.verifier-env"] == "EXPECTED='it'\"'\"'s 42'\n"
    assert task.unsupported == []


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ('[environment]\nworkdir = "app"\n', r"\[environment\] workdir: Value error, 'app' is not an absolute path"),
        ('[environment]\nworkdir = "/app/../etc"\n', r"has a '\.\.' component"),
        ('[environment.env]\nPATH = "/app/.venv/bin"\n', r"PATH: reserved by opencode-env .*`ENV PATH="),
        ('[environment.env]\n"A B" = "x"\n', r"\[environment\] env\.A B"),
        ('[environment.env]\nLD_PRELOAD = "/x.so"\n', r"LD_PRELOAD: refused"),
    ],
)
def test_bad_environment_settings_are_named(tmp_path, toml, named):
    with pytest.raises(TaskFormatError, match=named):
        HarborTask.from_dir(make_task(tmp_path, toml=toml))


@pytest.mark.parametrize(
    ("toml", "feature"),
    [
        (
            '[verifier.tests]\nfail_to_pass = ["t"]\n[[steps]]\nname = "one"\n',
            r"\[verifier\] tests with \[\[steps\]\]: each step is graded by its own tests/test.sh",
        ),
    ],
)
def test_features_we_cannot_carry_are_refused_by_name(tmp_path, toml, feature):
    """Refused before tests/ is read: a multi-step task has no tests/test.sh of its own, and must not be told so."""
    task = make_task(tmp_path, toml=toml)
    shutil.rmtree(task / "tests")
    with pytest.raises(TaskFormatError, match=feature):
        HarborTask.from_dir(task)


def test_an_empty_mcp_server_list_is_harbors_default(tmp_path):
    task = HarborTask.from_dir(make_task(tmp_path, toml="[environment]\nmcp_servers = []\n"))
    assert task.unsupported == []


def test_mcp_servers_reach_the_request_as_harbor_declares_them(tmp_path):
    toml = (
        '[[environment.mcp_servers]]\nname = "codes"\ntransport = "stdio"\ncommand = "python3"\nargs = ["/s.py"]\n'
        '[[environment.mcp_servers]]\nname = "kb"\nurl = "http://mcp-server:8000/sse"\n'
    )
    sidecar = Service(name="mcp-server", image="localhost/img:1", command=["python3", "/server.py"])
    task = HarborTask.from_dir(make_task(tmp_path, toml=toml, solution={"solve.sh": "true\n"}))
    request = task.to_request("img", "", oracle=True, services=[sidecar])
    assert [(s.name, s.transport, s.command, s.args, s.url) for s in request.mcp_servers] == [
        ("codes", "stdio", "python3", ["/s.py"], None),
        ("kb", "sse", None, [], "http://mcp-server:8000/sse"),
    ], "Harbor's default transport is sse"
    with pytest.raises(TaskFormatError, match=r"mcp_servers\.codes: stdio MCP servers are not supported yet"):
        task.to_request("img", "", services=[sidecar])


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ('[[environment.mcp_servers]]\nname = "m"\ntransport = "stdio"\n', r"mcp_servers.m.command"),
        ('[[environment.mcp_servers]]\nname = "m"\ncommand = "x"\nenv = {A = "1"}\n', r"mcp_servers\.0\.env"),
        ("[environment]\nmcp_servers = [" + '{name = "m", url = "http://127.0.0.1/"},' * 9 + "]\n", r"at most 8"),
    ],
)
def test_bad_mcp_servers_are_named_when_the_task_is_read(tmp_path, toml, named):
    with pytest.raises(TaskFormatError, match=named):
        HarborTask.from_dir(make_task(tmp_path, toml=toml))


def test_a_remote_mcp_server_off_the_rollouts_services_is_refused_naming_it(tmp_path):
    """Harbor's hello-mcp shape without its compose sidecar: the URL's host is nothing the sandbox has."""
    toml = '[[environment.mcp_servers]]\nname = "m"\ntransport = "streamable-http"\nurl = "http://m:8000/mcp"\n'
    task = HarborTask.from_dir(make_task(tmp_path, toml=toml))
    with pytest.raises(TaskFormatError, match=r"mcp_servers\.m\.url: host 'm' is not one of the rollout's services"):
        task.to_request("img", "")


def test_deviations_reach_the_caller(tmp_path):
    warned: list[str] = []
    toml = '[agent]\ntimeout_secs = 5\n[environment]\ndocker_image = "local/x:1"\n'
    request_from_task_dir(make_task(tmp_path, toml=toml), builder=_Present(), warn=warned.append)
    toml_path = tmp_path / "hello-task" / "task.toml"
    assert warned == [f"{toml_path}: [agent] timeout_secs: unknown key, ignored (did you mean 'timeout_sec'?)"]


class _Present(ImageBuilder):
    """A builder whose storage has every image, its WORKDIR /app."""

    def __init__(self) -> None:
        self.podman = "/nonexistent/podman"

    def image_exists(self, ref: str) -> bool:
        return True

    def image_workdir(self, ref: str) -> str:
        return "/app"

    def image_entrypoint(self, ref: str) -> list[str]:
        return []

    def image_user(self, ref: str) -> str:
        return ""


def test_the_entrypoint_starts_before_a_setup_the_caller_adds(tmp_path):
    task = HarborTask.from_dir(make_task(tmp_path))
    request = task.to_request("img", "/app", entrypoint=["/entrypoint.sh"], setup=["echo mine"])
    assert request.setup == [entrypoint_command(["/entrypoint.sh"]), "echo mine"]
    assert task.to_request("img", "/app", setup=["echo mine"]).setup == ["echo mine"]


def test_the_verifier_table_declares_the_reward_key_and_range(tmp_path):
    toml = TOML_1_0.replace("[verifier]\n", '[verifier]\nreward_key = "correctness"\nreward_range = [0, 10]\n')
    assert toml != TOML_1_0
    request = HarborTask.from_dir(make_task(tmp_path, toml=toml)).to_request("img", "/app")
    assert (request.reward_key, request.reward_range) == ("correctness", (0.0, 10.0))
    plain = HarborTask.from_dir(make_task(tmp_path, "plain")).to_request("img", "/app")
    assert (plain.reward_key, plain.reward_range) == (None, (0.0, 1.0))


def test_the_images_user_runs_the_oracle_and_the_entrypoint(tmp_path):
    task = HarborTask.from_dir(make_task(tmp_path, solution={"solve.sh": "id -u > /app/uid\n"}))
    oracle = task.to_request("img", "/app", oracle=True, entrypoint=["/e.sh"], user="app:5")
    assert (oracle.solution_as, oracle.image_user) == ("image_user", "app:5")
    assert "--reuid=app --regid=5 --clear-groups" in oracle.setup[0], "the entrypoint runs as the image's USER"
    agent = task.to_request("img", "/app", user="app")
    assert (agent.solution_as, agent.image_user) == ("user", "app"), "the agent's tools keep our user"
    for root in ("", "root", "0", "0:0"):
        assert task.to_request("img", "/app", oracle=True, user=root).solution_as == "root"
    with pytest.raises(TaskFormatError, match="image_user"):
        task.to_request("img", "/app", oracle=True, user="app;touch /x")


def test_the_tasks_skills_dir_is_given_to_opencode(tmp_path):
    task = HarborTask.from_dir(make_task(tmp_path, toml='[environment]\nskills_dir = "/skills"\n'))
    assert (task.unsupported, task.to_request("img", "/app").skills_dir) == ([], "/skills")
    relative = HarborTask.from_dir(make_task(tmp_path / "r", toml='[environment]\nskills_dir = "skills"\n'))
    assert relative.to_request("img", "/app").skills_dir == "/app/skills"
