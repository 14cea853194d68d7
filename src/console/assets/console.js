// fieldgate console: live updates over server-sent events. The server sends, once a
// second, a JSON object of element IDs and their new HTML (rendered and escaped on the
// server); this only puts each piece in its place. Without JavaScript the pages still
// work and show the values of the moment they were loaded.
(function () {
  "use strict";
  var url = document.body.getAttribute("data-live");
  var state = document.getElementById("live-state");
  if (!url || !window.EventSource) { return; }
  var source = new EventSource(url);
  source.addEventListener("snapshot", function (e) {
    var parts = JSON.parse(e.data);
    for (var id in parts) {
      var el = document.getElementById(id);
      if (el && el.getAttribute("data-html") !== parts[id]) {
        el.innerHTML = parts[id];
        el.setAttribute("data-html", parts[id]);
      }
    }
    if (state) { state.textContent = "live"; state.className = "live-ok"; }
  });
  source.onerror = function () {
    if (state) { state.textContent = "reconnecting…"; state.className = "live-lost"; }
  };
})();
