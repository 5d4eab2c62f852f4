// The batch page: its progress and its requests waiting for approval arrive over
// server-sent events, each message the whole fragment; `end` closes the stream.
(function () {
  const batch = document.currentScript.dataset.batch;
  const status = document.getElementById("connection");

  function swap(id) {
    return (e) => {
      const target = document.getElementById(id);
      target.innerHTML = JSON.parse(e.data).html;
      htmx.process(target);
    };
  }

  const stream = window.liveStream(() => {
    const source = new EventSource("/batches/" + encodeURIComponent(batch) + "/events");
    source.addEventListener("progress", swap("progress"));
    source.addEventListener("waiting", swap("waiting"));
    source.addEventListener("end", () => {
      stream.end();
      const cancel = document.getElementById("cancel-batch");
      if (cancel) cancel.remove();
      status.textContent = "ended";
      status.className = "dim";
    });
    return source;
  }, status);
})();
