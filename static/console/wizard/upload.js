// The wizard's resumable upload: sha256 in the browser (hash-wasm, chunk by chunk), then Conch's resumable
// uploads API (/api/v1/models/{id}/uploads/): parts PUT straight to the URLs it signs (S3) or to Conch's own
// part URL (folder storage), a few at a time, with progress, speed and time left; pause, resume, cancel; the
// upload's id kept in localStorage (model + file name + size), so after a reload the same file, chosen again,
// goes on from the parts the store already has; without that entry (another browser profile, storage cleared) the
// page asks the server for the model's open upload of a file of the same name, size and first bytes (the start
// stored their sha256: `head_sha256`) and goes on with it. Every rule (sizes, quota, checksum, format) is the
// server's: this file only moves bytes and shows what the API answers; the one thing it checks first is the file's
// size against the server's limit, which the page carries (data-max-bytes), so a file too big is refused before it
// is hashed.
// The upload is started before the file is hashed, with the file's first bytes (`head`): the server refuses a
// file it cannot build by its name or those bytes at once (builds/formats.py), and the sha256 goes with the
// completion. A part that fails on the network (no answer, 5xx, a timeout) is sent again by itself after 1, 2,
// 4 … s (at most RETRY_MAX_S apart, for RETRY_FOR_MS); an answer that names a problem (4xx) stops with it. A part
// is not given up for taking long, only for standing still: one whose bytes have not moved (no upload progress,
// no answer) for the page's stall time (data-stall-seconds, the CONCH_UPLOAD_STALL_SECONDS setting, 60 s) is
// aborted and sent again the same way.
// Each part goes with its CRC32 (hash-wasm, read in pieces like the sha256): the start asks for
// `part_checksum_algorithm` CRC32, every part URL is signed for its part's checksum, and the store refuses bytes
// that do not match (S3: 400 BadDigest; folder storage: 400 naming `parts[n]`), so a part damaged on the way is
// never stored; it is sent again like a network failure. An open upload started without the algorithm (an older
// page, curl) is resumed without checksums: the page follows the upload's `part_checksum_algorithm`.
// A file that already is a version of the model: once the sha256 is known, the start is sent again with it (it
// finds the upload just started), so the server refuses (409, `existing_version`) before a part is sent; the
// completion may be refused the same way. The page then links to that version and offers to upload the file as a
// new version anyway (`allow_duplicate`) or to cancel the upload.
(() => {
  "use strict";

  const root = document.getElementById("upload");
  if (!root) return;
  const input = document.getElementById("upload-file");
  const dropzone = document.getElementById("dropzone");
  const bar = document.getElementById("upload-bar");
  const progress = document.getElementById("upload-progress");
  const fileName = document.getElementById("upload-file-name");
  const errorBox = document.getElementById("upload-error");
  const pauseButton = document.getElementById("upload-pause");
  const resumeButton = document.getElementById("upload-resume");
  const cancelButton = document.getElementById("upload-cancel");
  const duplicateBox = document.getElementById("upload-duplicate");
  const duplicateText = document.getElementById("upload-duplicate-text");
  const duplicateLink = document.getElementById("upload-duplicate-link");
  const asNewButton = document.getElementById("upload-as-new");
  const duplicateCancelButton = document.getElementById("upload-duplicate-cancel");

  const uploadsUrl = root.dataset.uploadsUrl;
  const checkUrl = root.dataset.checkUrl; // POST /api/v1/uploads/check/: the format the server tells from the file
  const buildUrl = root.dataset.buildUrl;
  const deployUrl = root.dataset.deployUrl;
  const csrf = root.dataset.csrf;
  const maxBytes = Number(root.dataset.maxBytes);
  const maxText = root.dataset.maxText;
  const headBytes = Number(root.dataset.headBytes) || 512; // how many first bytes the server checks
  const HASH_CHUNK = 2 * 1024 * 1024;
  const PARALLEL_PARTS = 3;
  const SIGN_BATCH = 100; // the API signs at most 100 parts per call
  const PART_CHECKSUM_ALGORITHM = "CRC32";
  const RETRY_MAX_S = 30;
  const RETRY_FOR_MS = 5 * 60 * 1000; // then the page stops and waits for Resume
  const API_TIMEOUT_MS = 30 * 1000;
  // A part whose bytes stand still this long is aborted and sent again; a slow part that moves is never cut.
  const STALL_MS = (Number(root.dataset.stallSeconds) || 60) * 1000;
  // What the API's field names mean to a user, for its refusals ("File contents: This is not an ONNX model…"); a
  // field not listed is shown as the API names it.
  const FIELD_LABELS = {
    file: "File",
    filename: "File name",
    head: "File contents",
    size_bytes: "File size",
    sha256: "File checksum",
    part_size_bytes: "Part size",
  };

  const state = {
    file: null,
    sha256: "",
    upload: null, // the API's Upload object
    done: new Map(), // part number -> etag
    crcs: new Map(), // part number -> its CRC32 (base64 of the 4 big-endian bytes), read once per file
    inflight: new Map(), // part number -> {xhr, loaded, movedAt (ms), stalled}
    paused: false, // Pause pressed, or a problem that waits for Resume: no new part starts
    label: "", // what the progress line begins with while no part moves ("Paused", "Stopped")
    retry: { attempt: 0, since: 0, timer: null, waiting: false }, // the automatic retry after a network failure
    finished: false,
    allowDuplicate: false, // "Upload as a new version" was pressed: the file may already be a version
    duplicateAt: "", // where the server refused the file as a version's: "start" or "complete"
    samples: [], // [time ms, bytes sent] for the speed over the last seconds
    watchdog: null, // the timer that looks for parts standing still
  };

  const storageKey = (file) => `conch.upload:${root.dataset.model}:${file.name}:${file.size}`;

  // What this page remembers of an upload of `file`: {id, sha256}; an id alone from an older page.
  function remembered(file) {
    const text = localStorage.getItem(storageKey(file));
    if (!text) return null;
    try {
      const value = JSON.parse(text);
      if (value && typeof value.id === "string") return value;
    } catch (_) {
      // an id alone
    }
    return { id: text, sha256: "" };
  }

  function remember(file, upload, sha256) {
    localStorage.setItem(storageKey(file), JSON.stringify({ id: upload.id, sha256 }));
  }

  function showError(message) {
    errorBox.textContent = message;
    errorBox.hidden = !message;
  }

  // A network failure: not the server's refusal of something, so trying again may work.
  function isTransient(error) {
    return (
      error instanceof TypeError || // fetch: no answer ("Failed to fetch")
      (error && (error.name === "TimeoutError" || error.name === "AbortError")) ||
      (error && (error.status === 0 || error.status === 429 || error.status >= 500))
    );
  }

  function setButtons({ pause, resume, cancel }) {
    pauseButton.disabled = !pause;
    resumeButton.disabled = !resume;
    cancelButton.disabled = !cancel;
  }

  function describeBytes(n) {
    const units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
  }

  function describeSeconds(s) {
    if (!Number.isFinite(s)) return "—";
    s = Math.max(0, Math.round(s));
    const m = Math.floor(s / 60);
    return m > 0 ? `${m} min ${s % 60} s` : `${s} s`;
  }

  async function api(method, url, body) {
    const response = await fetch(url, {
      method,
      signal: AbortSignal.timeout(API_TIMEOUT_MS),
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrf, Accept: "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = { detail: text };
    }
    if (!response.ok) {
      const error = new Error((data && data.detail) || `HTTP ${response.status}`);
      error.status = response.status;
      error.field = data && data.field;
      error.body = data;
      throw error;
    }
    return data;
  }

  // --- sha256 and CRC32s, chunk by chunk (never the whole file in memory) ----------------------------------
  // The file is read through one reused buffer: a BYOB ("bring your own buffer") reader on blob.stream() fills
  // the same HASH_CHUNK bytes each time and hands them back. Reading with file.slice(…).arrayBuffer() instead
  // allocates a new buffer per piece; each is garbage at once but freed only when the garbage collector gets to
  // it, and over a 2 GiB file that lag held ~200 MiB (bench/browser_upload.py). Browsers whose Blob streams are
  // not byte streams get the slices. `holder.buffer` is the buffer to reuse (kept for the next read: the parts'
  // CRC32s are read one after another through the same one); returns the number of bytes read.
  async function readChunks(blob, onChunk, holder = { buffer: null }) {
    let reader = null;
    try {
      reader = blob.stream().getReader({ mode: "byob" });
    } catch (_) {
      // not a byte stream here: read slices
    }
    let read = 0;
    if (reader) {
      for (;;) {
        if (!holder.buffer || holder.buffer.byteLength !== HASH_CHUNK) holder.buffer = new ArrayBuffer(HASH_CHUNK);
        const { done, value } = await reader.read(new Uint8Array(holder.buffer, 0, HASH_CHUNK));
        holder.buffer = value ? value.buffer : null; // the read took the buffer over and gives it back in `value`
        if (done) break;
        onChunk(value);
        read += value.byteLength;
      }
    } else {
      for (let offset = 0; offset < blob.size; offset += HASH_CHUNK) {
        const chunk = new Uint8Array(await blob.slice(offset, offset + HASH_CHUNK).arrayBuffer());
        onChunk(chunk);
        read += chunk.length;
      }
    }
    return read;
  }

  async function computeSha256(file) {
    const hasher = await hashwasm.createSHA256();
    hasher.init();
    let hashed = 0;
    let shownPercent = -1;
    const show = () => {
      const percent = Math.floor((hashed / (file.size || 1)) * 100);
      if (percent === shownPercent) return;
      shownPercent = percent;
      bar.value = percent;
      progress.textContent = `Computing the checksum: ${percent} %`;
    };
    show();
    await readChunks(file, (chunk) => {
      hasher.update(chunk);
      hashed += chunk.byteLength;
      show();
    });
    if (hashed !== file.size) {
      throw new Error(`${file.name} changed while its checksum was computed (${hashed} of ${file.size} bytes read).`);
    }
    return hasher.digest("hex");
  }

  // Part `number`'s CRC32 as the API takes it (`checksums`): base64 of the 4 big-endian bytes (S3's
  // x-amz-checksum-crc32). hash-wasm's digest is those bytes in hex.
  const crcBuffer = { buffer: null };
  async function partCrc32(number) {
    const known = state.crcs.get(number);
    if (known) return known;
    const [begin, end] = partRange(number);
    const hasher = await hashwasm.createCRC32();
    hasher.init();
    const read = await readChunks(state.file.slice(begin, end), (chunk) => hasher.update(chunk), crcBuffer);
    if (read !== end - begin) {
      throw new Error(`${state.file.name} changed while it was sent (part ${number}: ${read} of ${end - begin} bytes read).`);
    }
    const hex = hasher.digest("hex");
    let binary = "";
    for (let i = 0; i < 8; i += 2) binary += String.fromCharCode(parseInt(hex.slice(i, i + 2), 16));
    const value = btoa(binary);
    state.crcs.set(number, value);
    return value;
  }

  // --- the upload ------------------------------------------------------------------------------------------------
  async function start(file, { allowDuplicate = false } = {}) {
    showError("");
    hideDuplicate();
    state.allowDuplicate = allowDuplicate;
    state.file = file;
    state.finished = false;
    state.paused = false;
    state.label = "";
    stopRetry();
    state.done = new Map();
    state.crcs = new Map();
    state.samples = [];
    fileName.textContent = `${file.name}, ${describeBytes(file.size)}`;
    progress.textContent = "Checking the file…";
    bar.value = 0;
    setButtons({ pause: false, resume: false, cancel: false });
    if (maxBytes > 0 && file.size > maxBytes) {
      state.upload = null;
      progress.textContent = "Not uploaded.";
      showError(
        `${file.name} is ${describeBytes(file.size)} (${file.size} bytes), larger than the ${maxText} ` +
          `(${maxBytes} bytes) a model file may be; an administrator can raise it with the ` +
          "CONCH_MAX_UPLOAD_BYTES setting.",
      );
      return;
    }
    state.upload = null;
    state.sha256 = "";
    let fresh = null;
    try {
      // the server says first whether it can build this file (its name, its first bytes), then it is hashed
      const told = await checkFile(file);
      fileName.textContent = `${file.name}, ${describeBytes(file.size)}: ${describeFormat(told)}`;
      const earlier = (await findEarlier(file)) || (await findOnServer(file));
      fresh = earlier ? null : await startUpload(file);
      state.upload = fresh;
      state.sha256 = await computeSha256(file);
      // a new upload is started again with the sha256, which finds it: a file that already is a version of the
      // model is refused now, before a part is sent
      state.upload = fresh ? await startUpload(file) : await takeEarlier(file, earlier);
      await sendParts();
    } catch (error) {
      if (fresh && error.status === 409 && error.body && error.body.existing_version) {
        // the upload this page just started for a file that already is a version holds no part but reserves the
        // file's size of the team's storage until it expires: abort it now ("Upload as a new version" starts a
        // new one, with allow_duplicate)
        // (nothing of it is remembered yet: sendParts records an upload in localStorage)
        try {
          await api("DELETE", `${uploadsUrl}${fresh.id}/`);
        } catch (_) {
          // the sweeper aborts it when it expires
        }
        state.upload = null;
      }
      failed(error);
    }
  }

  async function sendParts() {
    remember(state.file, state.upload, state.sha256);
    await refreshParts();
    setButtons({ pause: true, resume: false, cancel: true });
    await pump();
  }

  // The open upload this page started for the same file name and size, with what it remembers of it; null if none.
  async function findEarlier(file) {
    const known = remembered(file);
    if (!known) return null;
    try {
      const upload = await api("GET", `${uploadsUrl}${known.id}/`);
      if (upload.status === "uploading" && upload.size_bytes === file.size) return { upload, known };
    } catch (_) {
      // gone (aborted, expired): start a new one
    }
    localStorage.removeItem(storageKey(file));
    return null;
  }

  // The model's open upload of a file of this name, size and first bytes, found on the server (this page kept no
  // record of it: another browser profile, storage cleared); null if none. The newest one when there are several.
  async function findOnServer(file) {
    const head = await headSha256(file);
    const query = new URLSearchParams({ filename: file.name, size_bytes: String(file.size), head_sha256: head });
    let listed;
    try {
      listed = await api("GET", `${uploadsUrl}?${query}`);
    } catch (error) {
      if (isTransient(error)) throw error;
      return null; // refused: start a new upload
    }
    // (the server filtered already; checked again so that a server that ignores the filters resumes nothing else)
    const found = (listed.results || listed).filter(
      (upload) =>
        upload.status === "uploading" &&
        upload.filename === file.name &&
        upload.size_bytes === file.size &&
        upload.head_sha256 === head,
    );
    if (found.length === 0) return null;
    return { upload: found[found.length - 1], known: { id: found[found.length - 1].id, sha256: "" }, onServer: true };
  }

  // Go on with the earlier upload when it is of this very file: the same sha256, or, for an upload started
  // without one, the same first bytes (the build's sha256 check of the joined file still guards). Otherwise start
  // anew; an upload this page started is aborted, one found on the server is left to its owner.
  async function takeEarlier(file, { upload, known, onServer }) {
    const promised = upload.sha256 || known.sha256;
    const sameHead = !upload.head_sha256 || upload.head_sha256 === (await headSha256(file));
    if (sameHead && (!promised || promised === state.sha256)) {
      progress.textContent = "Resuming the upload where it stopped…";
      return upload;
    }
    if (!onServer) {
      try {
        await api("DELETE", `${uploadsUrl}${upload.id}/`);
      } catch (_) {
        // it expires by itself
      }
    }
    localStorage.removeItem(storageKey(file));
    return startUpload(file);
  }

  // The file's first bytes, as the start sends them (`head`), and their sha256 (how the server knows them again).
  async function headOf(file) {
    return new Uint8Array(await file.slice(0, headBytes).arrayBuffer());
  }
  async function headSha256(file) {
    return hashwasm.sha256(await headOf(file));
  }

  // Which format the server tells the file is, from its name and first bytes (400 naming `filename` or `head`
  // when Conch cannot build it, with the start's own messages).
  async function checkFile(file) {
    const head = await headOf(file);
    let binary = "";
    for (const byte of head) binary += String.fromCharCode(byte);
    try {
      return await api("POST", checkUrl, { filename: file.name, head: btoa(binary), size_bytes: file.size });
    } catch (error) {
      error.at = "start";
      throw error;
    }
  }

  // The check's answer in words: the format, and what the build does with it.
  function describeFormat(told) {
    if (!told.conversion) return `${told.title}, served as it is by Triton's ${told.served_as} backend`;
    return `${told.title}, converted to ONNX with ${told.conversion} and compared with its framework's outputs`;
  }

  // POST the start with the file's first bytes and, once known, its sha256; the server refuses (400) a file it
  // cannot build by its name (`filename`) or first bytes (`head`) before anything is reserved.
  async function startUpload(file) {
    const head = await headOf(file);
    let binary = "";
    for (const byte of head) binary += String.fromCharCode(byte);
    const body = {
      filename: file.name,
      size_bytes: file.size,
      head: btoa(binary),
      part_checksum_algorithm: PART_CHECKSUM_ALGORITHM,
    };
    if (state.sha256) body.sha256 = state.sha256;
    if (state.allowDuplicate) body.allow_duplicate = true;
    try {
      return await api("POST", uploadsUrl, body);
    } catch (error) {
      error.at = "start";
      throw error;
    }
  }

  async function refreshParts() {
    const upload = await api("GET", `${uploadsUrl}${state.upload.id}/`);
    state.upload = upload;
    state.done = new Map(upload.parts.map((part) => [part.number, part.etag]));
    showProgress();
  }

  function partRange(number) {
    const size = state.upload.part_size_bytes;
    const begin = (number - 1) * size;
    return [begin, Math.min(begin + size, state.file.size)];
  }

  function missingParts() {
    const missing = [];
    for (let n = 1; n <= state.upload.part_count; n += 1) {
      if (!state.done.has(n) && !state.inflight.has(n)) missing.push(n);
    }
    return missing;
  }

  let generation = 0;
  async function pump() {
    const mine = ++generation; // a pump left over from before a pause stops at its next turn
    while (!state.paused && !state.retry.waiting && !state.finished && mine === generation) {
      const missing = missingParts();
      if (missing.length === 0 && state.inflight.size === 0) {
        await complete();
        return;
      }
      const free = PARALLEL_PARTS - state.inflight.size;
      if (missing.length === 0 || free <= 0) {
        await waitForAPart();
        continue;
      }
      const batch = missing.slice(0, Math.min(free, SIGN_BATCH));
      const request = { numbers: batch };
      if (state.upload.part_checksum_algorithm === PART_CHECKSUM_ALGORITHM) {
        // each URL is signed for its part's CRC32 (an upload started without the algorithm takes none)
        request.checksums = {};
        for (const number of batch) request.checksums[number] = await partCrc32(number);
        if (state.paused || state.retry.waiting || mine !== generation) return;
      }
      const signed = await api("POST", `${uploadsUrl}${state.upload.id}/parts/`, request);
      if (state.paused || state.retry.waiting || mine !== generation) return;
      for (const part of signed.parts) {
        if (!state.done.has(part.number) && !state.inflight.has(part.number)) sendPart(part);
      }
    }
  }

  let wake = null;
  function waitForAPart() {
    return new Promise((resolve) => {
      wake = resolve;
    });
  }
  function wakeUp() {
    if (wake) {
      const resolve = wake;
      wake = null;
      resolve();
    }
  }

  function sendPart(part) {
    const [begin, end] = partRange(part.number);
    const xhr = new XMLHttpRequest();
    const entry = { xhr, loaded: 0, movedAt: performance.now(), stalled: false };
    state.inflight.set(part.number, entry);
    xhr.open(part.method || "PUT", part.url);
    xhr.timeout = 0; // no limit on the whole part: the watchdog aborts it when it stands still
    const conchUrl = new URL(part.url, window.location.href).origin === window.location.origin;
    for (const [name, value] of Object.entries(part.headers || {})) {
      if (name.toLowerCase() !== "content-length" && name.toLowerCase() !== "host") xhr.setRequestHeader(name, value);
    }
    if (conchUrl) xhr.setRequestHeader("X-CSRFToken", csrf); // Conch's own part URL: the session's credentials
    xhr.withCredentials = conchUrl;
    xhr.upload.onprogress = (event) => {
      entry.loaded = event.loaded;
      entry.movedAt = performance.now();
      showProgress();
    };
    xhr.onprogress = () => {
      entry.movedAt = performance.now(); // the answer is coming
    };
    xhr.onload = () => {
      state.inflight.delete(part.number);
      if (xhr.status >= 200 && xhr.status < 300) {
        let etag = xhr.getResponseHeader("ETag") || "";
        try {
          etag = JSON.parse(xhr.responseText).etag || etag;
        } catch (_) {
          // S3 answers with an empty body; the ETag header is the etag
        }
        state.done.set(part.number, etag);
        state.retry.attempt = 0;
        state.retry.since = 0;
        showProgress();
      } else {
        let detail = `part ${part.number}: HTTP ${xhr.status}`;
        let field = "";
        try {
          const answer = JSON.parse(xhr.responseText);
          detail = answer.detail || detail;
          field = answer.field || "";
        } catch (_) {
          // S3's errors are XML; the status says enough, or its code does
          if (/<Code>BadDigest<\/Code>/.test(xhr.responseText || "")) detail = `part ${part.number}: BadDigest`;
        }
        // the store refused bytes that do not match the part's CRC32 (damaged on the way): send it again
        const damaged = xhr.status === 400 && (field === `parts[${part.number}]` || detail.endsWith("BadDigest"));
        if (damaged) state.crcs.delete(part.number); // read again: the file may have changed on the disk
        if (damaged || isTransient({ status: xhr.status })) retryLater(`part ${part.number}: ${detail}`);
        else interrupt(`The upload stopped (${detail}). Press Resume to go on.`);
      }
      wakeUp();
    };
    xhr.onerror = () => {
      state.inflight.delete(part.number);
      retryLater(`the connection dropped while sending part ${part.number}`);
      wakeUp();
    };
    xhr.onabort = () => {
      state.inflight.delete(part.number);
      if (entry.stalled) retryLater(`part ${part.number} moved no bytes for ${STALL_MS / 1000} s`);
      wakeUp();
    };
    xhr.send(state.file.slice(begin, end));
    watchStalls();
  }

  // While parts are in flight, look every second (or quarter of the stall time) for one whose bytes have not moved
  // for STALL_MS: it is aborted (its onabort sends it again after the backoff).
  function watchStalls() {
    if (state.watchdog) return;
    state.watchdog = setInterval(
      () => {
        const now = performance.now();
        for (const entry of state.inflight.values()) {
          if (!entry.stalled && now - entry.movedAt >= STALL_MS) {
            entry.stalled = true;
            entry.xhr.abort();
          }
        }
        if (state.inflight.size === 0) {
          clearInterval(state.watchdog);
          state.watchdog = null;
        }
      },
      Math.min(1000, STALL_MS / 4),
    );
  }

  // A part that failed stops new parts from starting; the others in flight are let finish (their bytes count
  // once stored).
  function interrupt(message) {
    if (state.finished) return;
    stopRetry();
    showError(message);
    if (state.paused) return;
    state.paused = true;
    state.label = "Stopped";
    setButtons({ pause: false, resume: true, cancel: true });
    showProgress();
    wakeUp();
  }

  // A network failure (of a part or of an API call): no new part starts; after 1, 2, 4 … s (at most RETRY_MAX_S)
  // the page resumes by itself, from the parts the store holds, until RETRY_FOR_MS have passed since the last
  // part that went through. The parts still in flight are let finish.
  function retryLater(reason) {
    if (state.finished || state.paused || state.retry.waiting) return;
    const now = Date.now();
    if (!state.retry.since) state.retry.since = now;
    if (now - state.retry.since > RETRY_FOR_MS) {
      interrupt(
        `The connection is still lost after ${Math.round(RETRY_FOR_MS / 60000)} min of retrying (${reason}). ` +
          "Press Resume to go on from the parts stored.",
      );
      return;
    }
    let left = Math.min(RETRY_MAX_S, 2 ** state.retry.attempt);
    state.retry.attempt += 1;
    state.retry.waiting = true;
    state.label = "Waiting for the connection";
    setButtons({ pause: false, resume: true, cancel: true });
    const tell = () => {
      errorBox.textContent = `Connection lost (${reason}); retrying in ${left} s `;
      const now = document.createElement("button");
      now.type = "button";
      now.className = "link";
      now.dataset.testid = "upload-retry-now";
      now.textContent = "(Resume now)";
      now.addEventListener("click", resume);
      errorBox.append(now);
      errorBox.hidden = false;
    };
    tell();
    showProgress();
    state.retry.timer = setInterval(() => {
      left -= 1;
      if (left > 0) tell();
      else resume();
    }, 1000);
    wakeUp();
  }

  function stopRetry() {
    clearInterval(state.retry.timer);
    state.retry.timer = null;
    state.retry.waiting = false;
  }

  // No new part starts; those in flight finish and are kept, so nothing shown as stored is lost.
  function pause() {
    state.paused = true;
    stopRetry();
    showError("");
    state.label = "Paused";
    setButtons({ pause: false, resume: true, cancel: true });
    showProgress();
    wakeUp();
  }

  async function resume() {
    if (!state.file || !state.upload || state.finished) return;
    stopRetry();
    showError("");
    state.paused = false;
    state.label = "";
    state.samples = [];
    setButtons({ pause: true, resume: false, cancel: true });
    try {
      await refreshParts();
      if (state.upload.status !== "uploading") {
        await waitForCompletion(state.upload); // the completion went through before the connection dropped
        return;
      }
      await pump();
    } catch (error) {
      failed(error);
    }
  }

  async function cancel() {
    hideDuplicate();
    state.paused = true;
    stopRetry();
    state.finished = true;
    for (const { xhr } of state.inflight.values()) xhr.abort();
    state.inflight.clear();
    setButtons({ pause: false, resume: false, cancel: false });
    try {
      if (state.upload) await api("DELETE", `${uploadsUrl}${state.upload.id}/`);
    } catch (error) {
      showError(error.message);
    }
    if (state.file) localStorage.removeItem(storageKey(state.file));
    state.upload = null;
    bar.value = 0;
    progress.textContent = "Cancelled: nothing was kept. Choose a file to start again.";
  }

  async function complete() {
    state.finished = true;
    setButtons({ pause: false, resume: false, cancel: false });
    progress.textContent = "All parts sent; Conch is joining them and checking the size…";
    const body = state.upload.sha256 ? {} : { sha256: state.sha256 };
    if (state.allowDuplicate) body.allow_duplicate = true;
    let upload;
    try {
      upload = await api("POST", `${uploadsUrl}${state.upload.id}/complete`, body);
    } catch (error) {
      state.finished = false; // a network failure: a resume finds out whether the completion went through
      error.at = "complete";
      throw error;
    }
    await waitForCompletion(upload);
  }

  async function waitForCompletion(upload) {
    state.finished = true;
    setButtons({ pause: false, resume: false, cancel: false });
    const open = (u) => u.status === "completing" || u.status === "uploading";
    while (open(upload)) {
      // The server holds the answer until its check ends (a long poll of at most 10 s); an answer that comes back
      // early with the upload still open (or a dropped connection) is followed by a pause before asking again.
      const asked = Date.now();
      try {
        upload = await api("GET", `${uploadsUrl}${state.upload.id}/?wait=10`);
      } catch (error) {
        if (!isTransient(error)) throw error; // a dropped connection: ask again
      }
      if (open(upload) && Date.now() - asked < 5000) {
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    }
    localStorage.removeItem(storageKey(state.file));
    if (upload.status !== "completed") {
      state.upload = null;
      throw Object.assign(new Error(upload.error || `The upload ended ${upload.status}.`), { field: upload.error_field });
    }
    bar.value = 100;
    progress.textContent = `Uploaded (size checked; the build checks sha256 ${state.sha256}). Building version…`;
    window.location.assign(buildUrl.replace("{id}", upload.version));
  }

  function failed(error) {
    if (isTransient(error) && state.upload && !state.finished) {
      retryLater(error.message);
      return;
    }
    stopRetry();
    state.paused = true;
    const existing = error.status === 409 && error.body && error.body.existing_version;
    if (existing) {
      showDuplicate(existing, error.at);
      return;
    }
    setButtons({ pause: false, resume: !!state.upload && !state.finished, cancel: !!state.upload && !state.finished });
    if (!state.upload) progress.textContent = "Not uploaded.";
    showError(describeRefusal(error));
  }

  // "File contents: sentence" (the field's label), or the sentence alone when it begins with its field already.
  function describeRefusal(error) {
    if (!error.field || error.message.startsWith(error.field)) return error.message;
    return `${FIELD_LABELS[error.field] || error.field}: ${error.message}`;
  }

  // The server refused the file as one that already is `existing` ({id, number, status}) of this model, at
  // `at` ("start" or "complete"): say which, link to it, and offer to go on anyway or to cancel.
  function showDuplicate(existing, at) {
    state.duplicateAt = at;
    state.label = "Stopped";
    setButtons({ pause: false, resume: false, cancel: false });
    showError("");
    progress.textContent = "Not uploaded: this file already is a version of this model.";
    // what to do with that version, by its status (the console's words: its page has Rebuild and Deploy)
    const todo =
      existing.status === "built"
        ? "Deploy that version"
        : existing.status === "failed"
          ? "Open that version to see why its build failed and rebuild it with other options"
          : "Wait for that version's build";
    duplicateText.textContent =
      `This file is already version ${existing.number} of this model (${existing.status}). ` +
      `${todo}, upload the file as a new version anyway, or cancel the upload.`;
    // a built version links to its deploy step, any other to its build page
    const built = existing.status === "built";
    duplicateLink.textContent = `${built ? "Deploy" : "Open"} version ${existing.number}`;
    duplicateLink.href = (built ? deployUrl : buildUrl).replace("{id}", existing.id);
    bar.value = 0; // nothing of this file was sent (the bar may show its sha256 computed)
    duplicateBox.hidden = false;
  }

  function hideDuplicate() {
    duplicateBox.hidden = true;
    state.duplicateAt = "";
  }

  // "Upload as a new version": the refused step again, with allow_duplicate.
  async function uploadAsNew() {
    const at = state.duplicateAt;
    hideDuplicate();
    state.allowDuplicate = true;
    state.paused = false;
    state.label = "";
    try {
      if (at === "complete") {
        await complete();
      } else {
        state.upload = await startUpload(state.file);
        await sendParts();
      }
    } catch (error) {
      failed(error);
    }
  }

  // The bytes of the parts the store holds, and those of the parts on their way (which a dropped connection loses).
  function sentBytes() {
    let stored = 0;
    for (const number of state.done.keys()) {
      const [begin, end] = partRange(number);
      stored += end - begin;
    }
    let moving = 0;
    for (const { loaded } of state.inflight.values()) moving += loaded;
    return [stored, moving];
  }

  // The bar and the line count only stored parts, so they never go back when a part in flight is lost; the
  // bytes on their way are told apart ("+ N sending") and count for the speed only.
  function showProgress() {
    if (!state.upload || !state.file) return;
    const [stored, moving] = sentBytes();
    const total = state.file.size || 1;
    const now = performance.now();
    state.samples.push([now, stored + moving]);
    while (state.samples.length > 2 && now - state.samples[0][0] > 5000) state.samples.shift();
    const [t0, b0] = state.samples[0];
    const speed = now > t0 ? Math.max(0, (stored + moving - b0) * 1000) / (now - t0) : 0;
    const left = speed > 0 ? (total - stored - moving) / speed : Infinity;
    bar.value = (stored / total) * 100;
    const parts = `${state.done.size} of ${state.upload.part_count} parts`;
    const moved = state.paused || state.retry.waiting;
    let head = state.label && moved ? `${state.label}: ` : "";
    if (state.paused && state.inflight.size > 0) head = `${state.label}, finishing ${state.inflight.size} part(s): `;
    const sending = moving > 0 ? ` + ${describeBytes(moving)} sending` : "";
    progress.textContent =
      `${head}${describeBytes(stored)} of ${describeBytes(total)} stored (${((stored / total) * 100).toFixed(1)} %)` +
      `${sending}, ${parts}` +
      (moved ? "" : `, ${describeBytes(speed)}/s, ${describeSeconds(left)} left`);
    progress.dataset.sentBytes = String(stored);
  }

  // --- wiring -------------------------------------------------------------------------------------------------
  input.addEventListener("change", () => {
    if (input.files && input.files[0]) start(input.files[0]);
  });
  for (const name of ["dragenter", "dragover"]) {
    dropzone.addEventListener(name, (event) => {
      event.preventDefault();
      dropzone.classList.add("dragging");
    });
  }
  for (const name of ["dragleave", "drop"]) {
    dropzone.addEventListener(name, () => dropzone.classList.remove("dragging"));
  }
  dropzone.addEventListener("drop", (event) => {
    event.preventDefault();
    const file = event.dataTransfer && event.dataTransfer.files[0];
    if (file) start(file);
  });
  pauseButton.addEventListener("click", pause);
  resumeButton.addEventListener("click", resume);
  cancelButton.addEventListener("click", cancel);
  asNewButton.addEventListener("click", uploadAsNew);
  duplicateCancelButton.addEventListener("click", cancel);
})();
