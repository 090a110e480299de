"""End to end: a real `cvae serve --workers 2` on a free loopback port, a checkpoint swap under
load: no request fails, and no connection ever sees the step go back."""

from __future__ import annotations

import io
import threading
import time

import httpx
from PIL import Image

from cvae.training.callbacks import Checkpointer
from cvae.training.loop import train_and_evaluate
from servers import cvae_server



def test_real_server_serves_pngs_and_swaps_checkpoints_without_failing(tmp_path, trained_run):
    checkpoint_dir = trained_run.copy_to(tmp_path / "checkpoints")
    with cvae_server(checkpoint_dir, tmp_path / "server.log", "--poll-interval", "0.5",
                     workers=2) as server:
        url = server.url
        response = httpx.get(f"{url}/sample", params={"digit": 7}, timeout=30)
        assert response.status_code == 200
        with Image.open(io.BytesIO(response.content)) as image:
            assert image.size == (4 * 30 + 2, 4 * 30 + 2) and image.mode == "L"
        old_step = max(trained_run.steps)
        assert response.headers["x-checkpoint-step"] == str(old_step)

        results: list[tuple[int, str | None]] = []
        stop = threading.Event()

        def keep_requesting():
            with httpx.Client(base_url=url, timeout=30) as client:
                while not stop.is_set():
                    try:
                        reply = client.get("/sample", params={"digit": 7, "n": 4, "seed": 3})
                        results.append((reply.status_code, reply.headers.get("x-checkpoint-step")))
                    except httpx.TransportError as error:
                        results.append((0, repr(error)))

        client_thread = threading.Thread(target=keep_requesting)
        client_thread.start()
        try:
            # Continue the same run for one more epoch: Orbax writes a newer step into the
            # directory the server is reading.
            run = train_and_evaluate(trained_run.config.replace(epochs=3), trained_run.data,
                                     checkpoint_dir, callbacks=[Checkpointer()])
            new_step = str(run.step)
            deadline = time.monotonic() + 60
            while not any(step == new_step for _, step in results[-5:]):
                assert time.monotonic() < deadline, f"never served step {new_step}: {results[-5:]}"
                time.sleep(0.1)
        finally:
            stop.set()
            client_thread.join(60)
    failures = [result for result in results if result[0] != 200]
    assert not failures, failures[:5]
    assert len(results) >= 10
    steps = [int(step) for _, step in results]
    assert steps == sorted(steps) and steps[0] == old_step and steps[-1] == int(new_step)
