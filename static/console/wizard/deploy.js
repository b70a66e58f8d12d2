// The deploy form: show the fields of the runtime chosen, the GPUs of the cluster chosen (its offers table, its
// products and MIG profiles, and the most GPUs of the product chosen that one of its nodes holds, all as the page
// was rendered from the cluster's Nodes), and keep the Deploy button in step with the server's answer to "would it
// fit" (the partial it returns after each change). No rule is checked here: a count past what a node holds is
// refused by that answer.
(() => {
  "use strict";
  const form = document.getElementById("deploy-form");
  if (!form) return;
  const runtime = document.getElementById("deploy-runtime");
  const cluster = document.getElementById("deploy-cluster");
  const product = document.getElementById("deploy-gpu-product");
  const mig = document.getElementById("deploy-mig");
  const count = document.getElementById("deploy-gpu-count");
  const most = document.getElementById("deploy-gpu-most");
  const submit = document.getElementById("deploy-submit");

  function showRuntime() {
    for (const fieldset of form.querySelectorAll("fieldset[data-runtime]")) {
      const shown = fieldset.dataset.runtime === runtime.value;
      fieldset.hidden = !shown;
      fieldset.disabled = !shown; // a hidden runtime's fields are not sent
    }
  }

  // Only the chosen cluster's offers and options; a choice of another cluster's falls back to "any" / "—".
  function showCluster() {
    const name = cluster ? cluster.value : "";
    for (const block of form.querySelectorAll(".cluster-offers[data-cluster]")) {
      block.hidden = block.dataset.cluster !== name;
    }
    for (const select of [product, mig]) {
      if (!select) continue;
      for (const option of select.querySelectorAll("option[data-cluster]")) {
        const mine = option.dataset.cluster === name;
        option.hidden = !mine;
        option.disabled = !mine;
        if (!mine && option.selected) select.value = "";
      }
    }
    showMost();
  }

  // "At most N per pod": the chosen product's most on one node, or for "any" the most of any product there.
  function showMost() {
    if (!product || !count || !most) return;
    const chosen = product.selectedOptions[0];
    const offered =
      chosen && chosen.dataset.most ? [chosen] : [...product.querySelectorAll("option[data-most]:not([disabled])")];
    const counts = offered.map((option) => Number(option.dataset.most));
    if (counts.length === 0) {
      count.removeAttribute("max");
      most.textContent = "";
      return;
    }
    const max = Math.max(...counts);
    count.max = String(max);
    const what = chosen && chosen.dataset.most ? chosen.value : "any product";
    most.textContent = `${what}: at most ${max} per pod on ${cluster.value} (the most one of its nodes has)`;
  }

  function followVerdict() {
    const verdict = document.getElementById("deploy-fits");
    if (submit && verdict) submit.disabled = verdict.dataset.fits !== "true";
  }

  runtime.addEventListener("change", showRuntime);
  if (cluster) cluster.addEventListener("change", showCluster);
  if (product) product.addEventListener("change", showMost);
  document.body.addEventListener("htmx:afterSwap", followVerdict);
  showRuntime();
  showCluster();
  followVerdict();
})();
