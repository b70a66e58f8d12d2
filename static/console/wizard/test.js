// The test form: show the image fields or the JSON editor, as chosen. The server does the preprocessing.
(() => {
  "use strict";
  const form = document.getElementById("infer-form");
  if (!form) return;
  function showMode() {
    const chosen = form.querySelector('input[name="mode"]:checked');
    const mode = chosen ? chosen.value : "json";
    for (const fieldset of form.querySelectorAll("fieldset[data-mode]")) {
      fieldset.hidden = fieldset.dataset.mode !== mode;
    }
  }
  form.addEventListener("change", (event) => {
    if (event.target.name === "mode") showMode();
  });
  showMode();
})();
