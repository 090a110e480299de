// "Draw in the browser": the page draws the noise itself and runs the served model's
// sample.onnx with ONNX Runtime Web (WebAssembly), from the service's own copy of the pinned
// onnxruntime-web package (service/web/, no CDN). Where the browser has no WebAssembly, or the
// files are missing (setup without npm), the server draws the grid and the page says why.
//
// The page (index.html) calls `browserSampling.generate(params)` first: it returns true when
// the browser drew the grid, false to let the page ask the server; `drawnByServer(ms)` then
// reports the server's time. `browserSampling.last` keeps the last browser draw (noise, labels,
// pixels) so a test can compare it with the server's pixels for the same noise.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const PAD = 2;
  let runtime = null;   // Promise of the `ort` namespace
  let model = null;     // Promise of {session, step, noiseDim}

  // The mode's controls, after the page's own.
  const label = document.createElement("label");
  label.innerHTML = '<span><input id="in-browser" type="checkbox"> draw in the browser</span>';
  $("controls").append(label);
  const where = document.createElement("div");
  where.id = "where";
  where.setAttribute("role", "status");
  $("status").after(where);
  $("in-browser").addEventListener("change", () => $("controls").requestSubmit());

  function loadRuntime() {
    if (!runtime) {
      runtime = new Promise((resolve, reject) => {
        const script = document.createElement("script");
        script.src = "browser/ort/ort.wasm.min.js";
        script.onload = () => resolve(window.ort);
        script.onerror = () => reject(new Error(
          "onnxruntime-web is not installed on this server (make setup without npm)"));
        document.head.append(script);
      }).then((ort) => {
        ort.env.wasm.wasmPaths = new URL("browser/ort/", document.baseURI).href;
        ort.env.wasm.numThreads = 1;  // threads need cross-origin isolation; one is enough
        return ort;
      });
      runtime.catch(() => { runtime = null; });
    }
    return runtime;
  }

  function loadModel(ort) {
    if (!model) {
      model = (async () => {
        const response = await fetch("browser/sample.onnx");
        if (!response.ok) throw new Error("no sample.onnx from the server (" + response.status + ")");
        const bytes = new Uint8Array(await response.arrayBuffer());
        const session = await ort.InferenceSession.create(bytes, {executionProviders: ["wasm"]});
        return {session, step: response.headers.get("X-Checkpoint-Step"),
                noiseDim: Number(response.headers.get("X-Noise-Dim"))};
      })();
      model.catch(() => { model = null; });
    }
    return model;
  }

  // Noise drawn in the page: N(0, 1) by Box-Muller from a 32-bit generator seeded with the
  // seed (not the server's threefry draws: the same seed gives other digits than /sample),
  // times the temperature in float32 as the server does.
  function drawNoise(seed, count, temperature) {
    let state = (seed >>> 0) ^ 0x9e3779b9;
    const uniform = () => {  // mulberry32
      state = (state + 0x6d2b79f5) >>> 0;
      let t = state;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return (((t ^ (t >>> 14)) >>> 0) + 0.5) / 4294967296;
    };
    const noise = new Float32Array(count);
    for (let i = 0; i < count; i += 2) {
      const radius = Math.sqrt(-2 * Math.log(uniform())), angle = 2 * Math.PI * uniform();
      noise[i] = Math.fround(Math.fround(radius * Math.cos(angle)) * temperature);
      if (i + 1 < count) noise[i + 1] = Math.fround(Math.fround(radius * Math.sin(angle)) * temperature);
    }
    return noise;
  }

  // Pixels in [0, 1] -> uint8 as the service rounds them: float32 x * 255, halves to even.
  function toUint8(images) {
    const pixels = new Uint8Array(images.length);
    for (let i = 0; i < images.length; i++) {
      const value = Math.fround(Math.fround(Math.min(1, Math.max(0, images[i]))) * 255);
      let rounded = Math.round(value);
      if (value - Math.floor(value) === 0.5 && rounded % 2 === 1) rounded -= 1;
      pixels[i] = rounded;
    }
    return pixels;
  }

  // The service's grid layout (make_grid): `pad` px around every tile, background 0; tiles of
  // the served model's [height, width, channels] (the page's `servedModel`), grey or RGB.
  function gridUrl(pixels, rows, cols, scale) {
    const [height, width, channels] = window.servedModel.imageShape;
    const tall = height * scale, wide = width * scale;
    const canvas = document.createElement("canvas");
    canvas.width = cols * (wide + PAD) + PAD;
    canvas.height = Math.ceil(rows / cols) * (tall + PAD) + PAD;
    const context = canvas.getContext("2d");
    const picture = context.createImageData(canvas.width, canvas.height);
    picture.data.fill(0);
    for (let i = 3; i < picture.data.length; i += 4) picture.data[i] = 255;
    for (let tile = 0; tile < rows; tile++) {
      const left = PAD + (tile % cols) * (wide + PAD), top = PAD + Math.floor(tile / cols) * (tall + PAD);
      for (let y = 0; y < tall; y++) for (let x = 0; x < wide; x++) {
        const from = channels * ((tile * height + Math.floor(y / scale)) * width + Math.floor(x / scale));
        const at = 4 * ((top + y) * canvas.width + left + x);
        for (let c = 0; c < 3; c++) picture.data[at + c] = pixels[from + (channels === 3 ? c : 0)];
      }
    }
    context.putImageData(picture, 0, 0);
    return canvas.toDataURL("image/png");
  }

  async function drawInBrowser(params) {
    const started = performance.now();
    const ort = await loadRuntime();
    const {session, step, noiseDim} = await loadModel(ort);
    const names = window.servedModel.classNames;  // the page asks for a class by its name
    const digits = params.get("label") === null ? names.map((_, index) => index)
                                                : [names.indexOf(params.get("label"))];
    const n = Number(params.get("n")), seed = Number(params.get("seed"));
    const rows = digits.length * n;
    const noise = drawNoise(seed, rows * noiseDim, Math.fround(Number(params.get("temperature"))));
    const labels = Int32Array.from({length: rows}, (_, row) => digits[Math.floor(row / n)]);
    const outputs = await session.run({
      noise: new ort.Tensor("float32", noise, [rows, noiseDim]),
      label: new ort.Tensor("int32", labels, [rows])});
    const pixels = toUint8(outputs[session.outputNames[0]].data);
    const cols = digits.length > 1 ? n : Math.ceil(Math.sqrt(n));
    $("grid").src = gridUrl(pixels, rows, cols, Number(params.get("scale")));
    const ms = performance.now() - started;
    window.browserSampling.last = {noise, labels, pixels, rows, noiseDim, step};
    $("status").className = "";
    $("status").textContent = "seed " + seed + " (the page's own noise), checkpoint step " + step;
    where.textContent = "drawn in the browser (onnxruntime-web, WebAssembly) in " +
      ms.toFixed(0) + " ms";
    where.dataset.side = "browser";
    return true;
  }

  window.browserSampling = {
    last: null,
    async generate(params) {
      if (!$("in-browser").checked) return false;
      if (typeof WebAssembly !== "object") {
        where.textContent = "this browser has no WebAssembly: drawn by the server";
        where.dataset.side = "server-fallback";
        return false;
      }
      try {
        return await drawInBrowser(params);
      } catch (err) {
        where.textContent = String(err.message || err) + ": drawn by the server";
        where.dataset.side = "server-fallback";
        return false;
      }
    },
    drawnByServer(ms) {
      const took = "drawn by the server in " + ms.toFixed(0) + " ms";
      if (where.dataset.side === "server-fallback") {
        where.textContent = where.textContent.replace(/drawn by the server$/, took);
        where.dataset.side = "server-fallback-done";
      } else {
        where.textContent = took;
        where.dataset.side = "server";
      }
    },
  };
})();
