"""The report page in a real browser: Debian's headless Chromium (scripts/setup.sh --test installs it)
opens the file the CLI wrote, offline, driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: no port, no client library). The page must draw every chart
(the vendored d3-flame-graph's rects, the timeline's SVG), log no console error and throw no
exception, the weight switch must redraw the AI flame graph, and the screenshot of its first
screen must show the top finding (checked in the DOM: the finding's text and its box inside
the viewport). The screenshots (first screen, whole page) and the page are kept under
``/tmp/otelbpf-report-chromium/``.

Without Chromium the test is skipped, except in CI (``CI=true``), where setup.sh installed it."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_diagnose import steps
from test_diagnose_sched import job
from test_report_ai import profiles, spans

from harness.agent import REPO

CHROMIUM = shutil.which("chromium")
ARTIFACTS = Path("/tmp/otelbpf-report-chromium")
VIEWPORT = (1400, 1000)


def _as_fds_3_and_4(read_end: int, write_end: int) -> None:
    """In the browser's process, before exec: its command pipe on fd 3, its answer pipe on fd 4
    (through fresh copies first, since either may already sit on 3 or 4)."""
    r, w = os.dup(read_end), os.dup(write_end)
    os.dup2(r, 3)
    os.dup2(w, 4)


class DevTools:
    """The DevTools protocol over Chromium's pipe: JSON messages ended by NUL, commands on fd 3,
    answers and events on fd 4 (of the browser)."""

    def __init__(self, profile_dir: Path) -> None:
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()
        assert CHROMIUM
        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                "--no-first-run",
                f"--user-data-dir={profile_dir}",
                "about:blank",
            ],
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: _as_fds_3_and_4(to_chrome_r, from_chrome_w),
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        self.session = ""

    def _read(self) -> dict:
        while b"\0" not in self._buf:
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, **params) -> dict:
        self._id += 1
        msg: dict = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read()
            if m.get("id") == self._id:
                assert "error" not in m, (method, m["error"])
                return m.get("result", {})
            self.events.append(m)

    def wait_for(self, method: str) -> dict:
        for m in self.events:
            if m.get("method") == method:
                return m
        while True:
            m = self._read()
            self.events.append(m)
            if m.get("method") == method:
                return m

    def evaluate(self, expression: str) -> object:
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r["exceptionDetails"]
        return r["result"].get("value")

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (OSError, RuntimeError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._w)
        os.close(self._r)

    def problems(self) -> list[str]:
        """Console errors/warnings, uncaught exceptions and browser log errors seen so far."""
        out = []
        for m in self.events:
            p = m.get("params", {})
            if m.get("method") == "Runtime.exceptionThrown":
                out.append(f"exception: {p['exceptionDetails'].get('exception', {}).get('description') or p}")
            elif m.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append(f"console.{p['type']}: {[a.get('value', a.get('description')) for a in p['args']]}")
            elif m.get("method") == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
                out.append(f"log {p['entry']['level']}: {p['entry']['text']} ({p['entry'].get('url', '')})")
        return out


@pytest.fixture
def browser(tmp_path: Path):
    if not CHROMIUM:
        if os.environ.get("CI"):
            pytest.fail("no chromium: scripts/setup.sh --test installs it (apt-get install chromium)")
        pytest.skip("no chromium here (scripts/setup.sh --test installs it)")
    dt = DevTools(tmp_path / "chromium-profile")
    (target,) = [dt.call("Target.createTarget", url="about:blank")["targetId"]]
    dt.session = dt.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Runtime", "Log", "Page"):
        dt.call(f"{domain}.enable")
    dt.call(
        "Emulation.setDeviceMetricsOverride", width=VIEWPORT[0], height=VIEWPORT[1], deviceScaleFactor=1, mobile=False
    )
    yield dt
    dt.close()


def test_the_page_draws_offline_without_errors_and_opens_on_the_top_finding(tmp_path: Path, browser: DevTools) -> None:
    data = tmp_path / "out"
    data.mkdir()
    steps(23, memory="pageable", sync=True).export(data)
    spans(data)  # pid 21: CUDA spans under a request and an operator
    profiles(data)
    job(22, n=20, starved=True).export(data)  # off-CPU spans: a starved input pipeline
    page = tmp_path / "report.html"
    cli = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "report", str(data), "-o", str(page)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    browser.call("Page.navigate", url=page.as_uri())
    browser.wait_for("Page.loadEventFired")
    assert browser.evaluate("document.body.dataset.charts") == "drawn"
    # every flame graph drawn by the component, each timeline an SVG with its lanes' rects
    drawn = browser.evaluate("[...document.querySelectorAll('.flame')].map(e => e.querySelectorAll('svg rect').length)")
    assert isinstance(drawn, list) and len(drawn) >= 5 and all(n > 0 for n in drawn), drawn
    lanes = browser.evaluate(
        "[...document.querySelectorAll('svg.timeline')].map(s => s.querySelectorAll('rect').length)"
    )
    assert isinstance(lanes, list) and lanes and all(n > 0 for n in lanes), lanes
    # the AI flame graph's switch: another weight, another legend and another tree
    ai = "document.querySelector('select[id$=\"-weight\"]')"
    before = browser.evaluate(f"document.getElementById({ai}.id.replace('-weight', '-legend')).textContent")
    assert isinstance(before, str) and before.startswith("weight: kernel launches")
    browser.evaluate(f"(() => {{const s = {ai}; s.value = '2'; s.dispatchEvent(new Event('change')); }})()")
    after = browser.evaluate(f"document.getElementById({ai}.id.replace('-weight', '-legend')).textContent")
    assert isinstance(after, str) and after.startswith("weight: time waiting for the GPU"), after
    browser.evaluate("new Promise(r => setTimeout(r, 400))")  # the transition
    assert browser.problems() == []
    # the first screen shows the top finding: its heading in the DOM, its box inside the viewport
    top = browser.evaluate(
        "(() => { const h = document.querySelector('#finding-1 h3');"
        " const r = h.getBoundingClientRect();"
        " return [h.textContent, r.top, r.bottom, innerHeight]; })()"
    )
    assert isinstance(top, list)
    text, y0, y1, height = top
    assert text.startswith("1. input_starvation: job22 (pid 22): ~380.0 ms"), text  # the costliest cause planted
    assert 0 <= y0 < y1 <= height
    shot = browser.call("Page.captureScreenshot", format="png")["data"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    png = base64.b64decode(shot)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    (ARTIFACTS / "report.png").write_bytes(png)
    whole = browser.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
    (ARTIFACTS / "report-full.png").write_bytes(base64.b64decode(whole))
    shutil.copy(page, ARTIFACTS / "report.html")
