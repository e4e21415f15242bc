"""The page at `/`: a sentence in, its translation out, through the server's own REST API
(the page's script sends what a client would: a columnar predict request), with the target
language (a run of several), an n-best list with scores, constraints and the time taken."""

import html
import json

TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__NAME__: translate</title>
<style>
body{font-family:system-ui,sans-serif;max-width:46rem;margin:2rem auto;padding:0 1rem}
textarea,input,select{font:inherit;width:100%;box-sizing:border-box}
label{display:block;margin-top:.8rem}
.row{display:flex;gap:1rem}.row label{flex:1}
#translation{font-size:1.3rem;margin:1rem 0;min-height:1.5em}
#error{color:#a00}#time{color:#555}
table{border-collapse:collapse}td{padding:.1rem .6rem .1rem 0}
</style></head><body>
<h1>__NAME__</h1>
<p>Model <code>__NAME__</code> version __VERSION__, served by __ENGINE__.</p>
<form id="form">
<label>Sentence<textarea id="sentence" rows="3" required></textarea></label>
<div class="row">
__LANGUAGES__
<label>N-best (hypotheses; 1: the best only)
<input id="nbest" type="number" min="1" max="__BEAM__" value="1"></label>
<label>Beam<input id="beam" type="number" min="1" max="64" value="__BEAM__"></label>
</div>
<label>Constraints (phrases the translation must contain, one per line)
<textarea id="constraints" rows="2"></textarea></label>
__KEY__
<p><button id="translate" type="submit">Translate</button></p>
</form>
<div id="translation"></div>
<table id="hypotheses"></table>
<p id="time"></p><p id="error"></p>
<script>
const MODEL = __MODEL__, MULTI = __MULTI__;
const $ = (id) => document.getElementById(id);
$("form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const nbest = Number($("nbest").value), beam = Number($("beam").value);
  const phrases = $("constraints").value.split("\\n").map((p) => p.trim()).filter((p) => p);
  const inputs = {sentences: [$("sentence").value], beam_size: beam};
  if (phrases.length) inputs.constraints = [phrases.join("\\t")];
  if (MULTI) inputs.target_language = [$("language").value];
  if (nbest > 1) inputs.num_hypotheses = nbest;
  const request = {signature_name: nbest > 1 ? "translate_nbest" : "serving_default", inputs};
  const headers = {"Content-Type": "application/json"};
  if ($("key") && $("key").value) headers["Authorization"] = "Bearer " + $("key").value;
  for (const id of ["translation", "hypotheses", "time", "error"]) $(id).textContent = "";
  $("translate").disabled = true;
  const began = performance.now();
  try {
    const reply = await fetch(`/v1/models/${MODEL}:predict`,
                              {method: "POST", headers, body: JSON.stringify(request)});
    const answer = await reply.json();
    const took = performance.now() - began;
    if (!reply.ok) throw new Error(answer.error || reply.statusText);
    const out = answer.outputs;
    const texts = nbest > 1 ? out.translations[0] : [out.translations[0]];
    const scores = nbest > 1 ? out.scores[0] : [out.scores[0]];
    $("translation").textContent = texts[0];
    texts.forEach((text, i) => {
      const row = $("hypotheses").insertRow();
      row.insertCell().textContent = scores[i].toFixed(3);
      row.insertCell().textContent = text;
    });
    $("time").textContent = `${took.toFixed(0)} ms`;
  } catch (error) {
    $("error").textContent = error.message;
  } finally {
    $("translate").disabled = false;
  }
});
</script></body></html>
"""


def html_page(name, version, engine, beam_size, languages, api_keys):
    """The page of a model: its name and version, what serves it, the run's beam, its
    target languages (a run of one pair: none to choose), an API key field if keys are on."""
    options = "".join(f"<option>{html.escape(language)}</option>" for language in languages)
    choice = (f'<label>Target language<select id="language">{options}</select></label>'
              if languages else "")
    key = ('<label>API key<input id="key" type="password" autocomplete="off"></label>'
           if api_keys else "")
    values = {"__NAME__": html.escape(name), "__VERSION__": html.escape(str(version)),
              "__ENGINE__": html.escape(engine), "__BEAM__": str(int(beam_size)),
              "__LANGUAGES__": choice, "__KEY__": key,
              "__MODEL__": json.dumps(name), "__MULTI__": json.dumps(bool(languages))}
    text = TEMPLATE
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    return text


def for_model(served):
    """The page of a `ServedModel`."""
    return html_page(served.name, served.version, served.engines.describe(folder=False),
                     served.table["serving_default"].input("beam_size").default,
                     served.languages, served.access.on)
