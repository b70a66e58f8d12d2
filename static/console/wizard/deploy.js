// The deploy form: show the fields of the runtime chosen, and keep the Deploy button in step with the server's
// answer to "would it fit" (the partial it returns after each change). No rule is checked here.
(() => {
  "use strict";
  const form = document.getElementById("deploy-form");
  if (!form) return;
  const runtime = document.getElementById("deploy-runtime");
  const submit = document.getElementById("deploy-submit");

  function showRuntime() {
    for (const fieldset of form.querySelectorAll("fieldset[data-runtime]")) {
      const shown = fieldset.dataset.runtime === runtime.value;
      fieldset.hidden = !shown;
      fieldset.disabled = !shown; // a hidden runtime's fields are not sent
    }
  }

  function followVerdict() {
    const verdict = document.getElementById("deploy-fits");
    if (submit && verdict) submit.disabled = verdict.dataset.fits !== "true";
  }

  runtime.addEventListener("change", showRuntime);
  document.body.addEventListener("htmx:afterSwap", followVerdict);
  showRuntime();
  followVerdict();
})();
