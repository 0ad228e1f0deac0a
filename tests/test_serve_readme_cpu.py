"""CPU tier: the server examples of README.md's "## The server", read from the README itself and run as written
against the command line's own server on this machine (no GPU: the numpy engine on the tiny preset), so that the
examples and the server cannot drift apart: the first server line of the ```bash block, its curl line (with curl
when there is one, else its JSON body posted), and the ```python block, exec'd."""
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the server needs fastapi and uvicorn (the serve extra)")
pytest.importorskip("openai", reason="the README's python example uses the openai client (the dev extra)")

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLE_URL = "localhost:8000"


def server_section() -> str:
    text = README.read_text()
    start = text.index("\n## The server\n")
    return text[start:text.index("\n## ", start + 1)]


def block(language: str) -> str:
    found = re.search(rf"```{language}\n(.*?)```", server_section(), re.DOTALL)
    assert found, f"README.md's '## The server' has no ```{language} block"
    return found.group(1)


def bash_commands() -> list[str]:
    """The ```bash block's commands, continuation lines joined, comments dropped."""
    joined = block("bash").replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory):
    """The README's first `python -m common.serve` line as written, on a free port instead of 8000."""
    from common.serve.server import loopback_socket

    line = next(c for c in bash_commands() if c.startswith("python -m common.serve"))
    assert "--port 8000" in line
    with loopback_socket() as sock:
        port = sock.getsockname()[1]
    argv = shlex.split(line.replace("--port 8000", f"--port {port}"))
    log = open(tmp_path_factory.mktemp("readme") / "server.log", "w+")
    proc = subprocess.Popen([sys.executable, *argv[1:]], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""},
                            cwd=README.parent)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"`{line}` exited with {proc.returncode}:\n{log.read()}")
            assert time.monotonic() < deadline, f"`{line}` did not answer /health in 300 s"
            try:
                with urllib.request.urlopen(url + "/health", timeout=5):
                    break
            except OSError:
                time.sleep(0.3)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_the_readme_curl_line_works_as_written(readme_server):
    line = next(c for c in bash_commands() if c.startswith("curl"))
    assert EXAMPLE_URL in line
    line = line.replace(EXAMPLE_URL, readme_server.removeprefix("http://"))
    if shutil.which("curl"):
        done = subprocess.run(shlex.split(line) + ["--fail-with-body"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        answer = json.loads(done.stdout)
    else:                                       # the same request: the body after -d, to the URL it names
        args = shlex.split(line)
        body = args[args.index("-d") + 1].encode()
        url = "http://" + next(a for a in args if a.startswith(readme_server.removeprefix("http://")))
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.loads(r.read())
    assert answer["object"] == "text_completion" and answer["choices"][0]["finish_reason"] in ("stop", "length")


def test_the_readme_python_example_works_as_written(readme_server):
    code = block("python")
    assert f"http://{EXAMPLE_URL}/v1" in code
    before = finished(readme_server)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code.replace(f"http://{EXAMPLE_URL}/v1", readme_server + "/v1"), "README.md", "exec"), {})
    assert finished(readme_server) == before + 1                       # its request ran to its end


def finished(url) -> float:
    from common.serve.metrics import read_metric

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return read_metric(r.read().decode(), "tiny_vllm:request_success_total")
