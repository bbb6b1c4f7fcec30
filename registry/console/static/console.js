// loraplane console: progressive enhancement only; every page works without JavaScript.
(function () {
  "use strict";
  // Canary weight sliders show their value next to them.
  function bindSliders(root) {
    root.querySelectorAll("input[type=range][data-output]").forEach(function (input) {
      var out = document.getElementById(input.getAttribute("data-output"));
      if (!out) return;
      input.addEventListener("input", function () { out.textContent = input.value + " %"; });
    });
  }
  document.addEventListener("DOMContentLoaded", function () { bindSliders(document); });
  // The self-refreshing adapters table does not refresh while focus is inside it, so keyboard
  // users do not lose their place.
  document.addEventListener("htmx:beforeRequest", function (evt) {
    var target = evt.detail && evt.detail.elt;
    if (target && target.id === "adapter-rows" && target.contains(document.activeElement)) {
      evt.preventDefault();
    }
  });
})();
