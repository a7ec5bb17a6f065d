# The chat page at / in Debian's headless Chromium: tests/web/page_test.mjs (puppeteer-core) loads it
# from a real `lineage serve`, sends two messages, waits for the streamed replies and the numbers the
# page shows, and writes a screenshot, checked here to be a real PNG of the page's size.
import os
import struct
import subprocess
from pathlib import Path

from conftest import Server

WEB = Path(__file__).resolve().parents[1] / "web"


def test_chat_page_in_chromium(hybrid_dir, tmp_path):
    assert (WEB / "node_modules" / "puppeteer-core").is_dir(), "run scripts/install-deps.sh --test (npm ci in tests/web)"
    s = Server(hybrid_dir, "--ctx", "1024", "--checkpoint-every", "16")
    try:
        status, ctype, page = s.request("GET", "/")
        assert status == 200 and ctype.startswith("text/html") and b"<title>lineage chat</title>" in page
        assert b"http://" not in page and b"https://" not in page, "the page loads nothing from elsewhere"
        out = Path(os.environ.get("LINEAGE_SCREENSHOT_DIR", tmp_path)) / "chat_page.png"
        p = subprocess.run(["node", str(WEB / "page_test.mjs"), str(s.port), str(out)], capture_output=True, text=True,
                           timeout=240)
        assert p.returncode == 0, f"page test failed:\n{p.stdout}\n{p.stderr}"
        png = out.read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png[16:24])
        assert (width, height) == (1000, 700) and len(png) > 10000, (width, height, len(png))
    finally:
        s.stop()
