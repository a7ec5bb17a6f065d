# The official OpenAI client (npm `openai`, tests/serve/client) driving a real `lineage serve` on
# loopback with an API key: models, completions (logprobs, echo), chat (streamed with usage,
# logprobs, tools) and its error classes (tests/serve/client/openai_client.mjs).
import shutil
import subprocess
from pathlib import Path

from conftest import Server

CLIENT = Path(__file__).resolve().parent / "client"


def test_the_official_openai_client(hybrid_dir, tmp_path):
    assert (CLIENT / "node_modules" / "openai").is_dir(), "run `npm ci` in tests/serve/client (scripts/install-deps.sh --test)"
    model = tmp_path / "model"
    shutil.copytree(hybrid_dir, model)
    template = Path(__file__).resolve().parents[1] / "chat_template" / "templates" / "qwen3.jinja"
    shutil.copy(template, model / "chat_template.jinja")
    (tmp_path / "key").write_text("client-test-key\n")
    s = Server(model, "--ctx", "1024", "--slots", "2", "--api-key-file", str(tmp_path / "key"))
    try:
        p = subprocess.run(["node", str(CLIENT / "openai_client.mjs"), f"http://127.0.0.1:{s.port}/v1", "client-test-key"],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "every call as expected" in p.stdout
    finally:
        s.stop()
