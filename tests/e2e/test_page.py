"""The web status page in headless Chromium against a real smeltd.

Needs: smeltd and smelt-trainer built ($SMELT_BUILD, default build-cpu), the Debian
packages chromium and chromium-driver, and `python3 -m pip install selenium pytest`.
Run: python3 -m pytest tests/e2e/test_page.py -v
A screenshot of the page with a training job lands in tests/e2e/artifacts/page.png.
"""
import json
import pathlib
import shutil
import sys
import time
import urllib.request

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from smeltd_harness import ADMIN_KEY, TRAIN_FILE, VAL_FILE, Smeltd, make_models_dir, prompts_rows  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = pathlib.Path(__file__).resolve().parent / "artifacts"
TRAIN_WAIT_S = 180
# Few steps keep the job to well under a minute on a busy 2-core machine.
JOB_REQUEST = {
    "model": "tiny",
    "model_init": "random",
    "hyperparameters": {"n_epochs": 1, "batch_size": 16, "max_steps": 30},
    "data": {"max_seq_len": 32},
    "suffix": "e2e",
}
# A tiny GRPO job (3 iterations of 4 prompts x 4 samples) with two verifiers and evaluations.
GRPO_HP = {"batch_size": 4, "num_generations": 4, "max_new_tokens": 4, "max_iterations": 3,
           "learning_rate_multiplier": 10, "kv_memory_mb": 4, "beta": 0}
GRPO_REWARD = {"verifiers": [{"type": "exact_match", "extract": {"type": "full"}},
                             {"type": "length_penalty", "max_tokens": 4, "cache_tokens": 1, "weight": 0.5}]}

try:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException, WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # reported by the browser fixture
    webdriver = None


# ---------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def smeltd(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smeltd")
    data_dir = tmp / "data"
    data_dir.mkdir()
    # two CPU slots: the RL job runs beside the supervised one
    server = Smeltd(str(data_dir), make_models_dir(str(tmp)), ["--cpu-slots", "2"]).start()
    try:
        yield server
        crashed = server.proc.poll()
        assert crashed is None, f"smeltd died during the tests (exit {crashed}):\n{server.read_log()}"
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        server.kill()
        shutil.copyfile(server.log_path, ARTIFACTS / "smeltd.log")


@pytest.fixture(scope="module")
def training_job(smeltd):
    """A small job that trains while the page tests run."""
    status, f = smeltd.upload(TRAIN_FILE)
    assert status == 200 and f["status"] == "processed", f
    status, job = smeltd.request("POST", "/v1/fine_tuning/jobs", dict(JOB_REQUEST, training_file=f["id"]))
    assert status == 200, f"job create refused: {job}"
    return job


@pytest.fixture(scope="module")
def grpo_job(smeltd):
    """A tiny GRPO job, for the RL view."""
    ids = []
    for path, n, name in ((TRAIN_FILE, 32, "grpo_train.jsonl"), (VAL_FILE, 8, "grpo_val.jsonl")):
        status, f = smeltd.upload_bytes(prompts_rows(path, n), name)
        assert status == 200 and f["status"] == "processed", f
        ids.append(f["id"])
    status, job = smeltd.request("POST", "/v1/fine_tuning/jobs", {
        "model": "tiny", "training_file": ids[0], "validation_file": ids[1], "seed": 5, "model_init": "random",
        "method": {"type": "grpo", "grpo": {"hyperparameters": GRPO_HP, "reward": GRPO_REWARD}},
        "eval": {"every_steps": 2, "accuracy_examples": 8}})
    assert status == 200, f"grpo job create refused: {job}"
    return job


# ---------------------------------------------------------------- the browser


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    if webdriver is None:
        pytest.skip("selenium is not installed (python3 -m pip install selenium)")
    chromium, driver_path = find_chromium(), shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip("Chromium or chromedriver is missing (apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--lang=en-US"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    except WebDriverException as e:
        pytest.skip(f"Chromium could not be started by chromedriver: {e.msg}")
    driver.set_script_timeout(20)
    yield driver
    driver.quit()


def open_page(browser, smeltd, key=None):
    """Loads the page with an empty localStorage and, if key is given, enters it."""
    browser.get(smeltd.base_url + "/")
    browser.execute_script("localStorage.clear()")
    browser.get(smeltd.base_url + "/")
    if key is not None:
        box = browser.find_element(By.ID, "api-key")
        box.clear()
        box.send_keys(key)
        browser.find_element(By.ID, "save-key").click()


def wait_for(browser, predicate, seconds, what, smeltd=None):
    try:
        # the page re-renders its tables on every poll: a stale element means "look again"
        return WebDriverWait(browser, seconds, poll_frequency=0.25,
                             ignored_exceptions=(StaleElementReferenceException,)).until(lambda d: predicate(d))
    except TimeoutException:
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "failure.png"))
        console = "\n".join(str(e) for e in browser.get_log("browser"))[-3000:]
        tail = smeltd.read_log() if smeltd else ""
        pytest.fail(f"timed out after {seconds} s waiting for {what}; screenshot in {ARTIFACTS / 'failure.png'}\n"
                    f"browser console:\n{console}\nsmeltd log:\n{tail}")


def text_of(browser, element_id):
    return browser.find_element(By.ID, element_id).text


def severe_console_errors(browser):
    return [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"
            and "favicon" not in e.get("message", "")]


# ---------------------------------------------------------------- tests


def test_training_job_live(browser, smeltd, training_job):
    job_id = training_job["id"]
    open_page(browser, smeltd, ADMIN_KEY)
    row = f'#jobs-table tr[data-job-id="{job_id}"]'
    cells = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, row).text, 15, "the job in the jobs table",
                     smeltd)
    assert "tiny" in cells, cells
    wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, row).click() or True, 5, "a click on the job")
    wait_for(browser, lambda d: d.find_element(By.ID, "job-detail").is_displayed(), 10, "the job detail", smeltd)
    assert text_of(browser, "detail-id") == job_id

    def loss_points(d):
        return int(d.find_element(By.ID, "loss-chart").get_attribute("data-points") or 0)

    wait_for(browser, lambda d: loss_points(d) >= 3, TRAIN_WAIT_S, "points on the loss chart", smeltd)
    # Chart.js drew them (not only the page's own counter).
    drawn = browser.execute_script(
        "const c = Chart.getChart(document.getElementById('loss-chart'));"
        "return c ? c.data.datasets.reduce((n, s) => n + s.data.length, 0) : -1;")
    assert drawn >= 3, f"Chart.js holds {drawn} loss points"
    for chart in ("lr-chart", "grad-chart", "tps-chart"):
        assert int(browser.find_element(By.ID, chart).get_attribute("data-points")) > 0, chart
    for hidden in ("reward-chart-figure", "kl-chart-figure", "length-chart-figure", "dist-chart-figure",
                   "hist-chart-figure", "critic-chart-figure", "rl-view"):
        assert not browser.find_element(By.ID, hidden).is_displayed(), f"{hidden} shows without RL metrics"
    events = browser.find_elements(By.CSS_SELECTOR, "#events li")
    assert any("Job queued" in e.text for e in events), [e.text for e in events][:5]
    assert any("training loss" in e.text for e in events), "metrics events are listed"

    # The stream keeps the chart growing while the job runs; the job ends with a model.
    wait_for(browser, lambda d: "succeeded" in text_of(d, "detail-status"), TRAIN_WAIT_S,
             "the job to succeed", smeltd)
    wait_for(browser, lambda d: loss_points(d) >= 30 and "ft:tiny:e2e:" in text_of(d, "detail-fields"), 20,
             "all 30 steps on the chart and the fine-tuned model", smeltd)
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#checkpoints tbody tr"), 15, "a checkpoint", smeltd)
    wait_for(browser, lambda d: "ended" in text_of(d, "stream-status"), 15, "the stream's end", smeltd)
    assert not browser.find_element(By.ID, "rl-view").is_displayed(), "a supervised job shows the RL view"
    assert text_of(browser, "log").strip(), "the log tail is shown"
    assert browser.find_element(By.ID, "cancel-job").get_attribute("disabled"), "an ended job cannot be cancelled"
    assert not browser.find_element(By.ID, "errors").is_displayed(), text_of(browser, "errors")
    assert not severe_console_errors(browser)

    ARTIFACTS.mkdir(exist_ok=True)
    browser.execute_script("document.getElementById('jobs-section').scrollIntoView()")
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, min(max(height + 140, 1000), 4000))
    time.sleep(0.5)
    browser.save_screenshot(str(ARTIFACTS / "page.png"))
    browser.set_window_size(1400, 1000)


def test_key_kept_and_forgotten(browser, smeltd, training_job):
    open_page(browser, smeltd, ADMIN_KEY)
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr"), 15, "jobs", smeltd)
    assert browser.execute_script("return localStorage.getItem('smelt.apiKey')") == ADMIN_KEY
    browser.refresh()  # the key survives a reload
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr"), 15, "jobs after reload")
    browser.find_element(By.ID, "forget-key").click()
    assert browser.execute_script("return localStorage.getItem('smelt.apiKey')") is None
    assert not browser.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")
    assert browser.find_element(By.ID, "api-key").get_attribute("value") == ""


def test_refused_key_is_reported(browser, smeltd):
    open_page(browser, smeltd, "sk-smelt-not-a-real-key")
    wait_for(browser, lambda d: d.find_element(By.ID, "errors").is_displayed(), 10, "the error banner")
    assert "Incorrect API key provided" in text_of(browser, "errors")
    assert "401" in text_of(browser, "errors")
    assert "refused" in text_of(browser, "key-status")


def test_cluster_view(browser, smeltd):
    open_page(browser, smeltd, ADMIN_KEY)
    wait_for(browser, lambda d: "local" in text_of(d, "agents-table"), 15, "the local agent", smeltd)
    cluster = text_of(browser, "cluster")
    assert "cpu:0" in cluster and "online" in cluster, cluster


def test_upload_shows_validation_errors(browser, smeltd, tmp_path):
    bad = tmp_path / "broken.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
                   "this is not json\n")
    open_page(browser, smeltd, ADMIN_KEY)
    browser.find_element(By.ID, "upload-file").send_keys(str(bad))
    browser.find_element(By.ID, "upload-button").click()
    wait_for(browser, lambda d: "line 2" in text_of(d, "upload-result"), 15, "the validation report", smeltd)
    assert "failed validation" in text_of(browser, "upload-result")
    wait_for(browser, lambda d: "broken.jsonl" in text_of(d, "files-table"), 10, "the file in the list")
    row = '//table[@id="files-table"]//tr[td[text()="broken.jsonl"]]'
    assert "error" in wait_for(browser, lambda d: d.find_element(By.XPATH, row).text, 5, "the file's row")
    wait_for(browser, lambda d: d.find_element(By.XPATH, row + "//button").click() or True, 5, "the errors button")
    assert "line 2" in text_of(browser, "files-table")
    # a file that failed validation is not offered for training
    options = browser.find_elements(By.CSS_SELECTOR, "#submit-training-file option")
    assert all("broken.jsonl" not in o.text for o in options)


def test_api_text_is_escaped(browser, smeltd, tmp_path):
    name = "<img src=x onerror=window.__pwned=1>.jsonl"
    f = tmp_path / "evil.jsonl"
    f.write_text(pathlib.Path(TRAIN_FILE).read_text().splitlines()[0] + "\n")
    status, _ = smeltd.upload(str(f), filename=name)
    assert status == 200
    open_page(browser, smeltd, ADMIN_KEY)
    wait_for(browser, lambda d: "onerror" in text_of(d, "files-table"), 15, "the file with markup in its name")
    assert not browser.find_elements(By.CSS_SELECTOR, "#files-table img")
    assert browser.execute_script("return window.__pwned === undefined")


def test_submit_refusal_shows_api_error(browser, smeltd, training_job):
    open_page(browser, smeltd, ADMIN_KEY)
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#submit-training-file option[value^='file-']")
             and d.find_elements(By.CSS_SELECTOR, "#submit-model option[value='tiny']"), 15, "the form's choices")
    browser.find_element(By.ID, "submit-epochs").send_keys("1")
    extra = browser.find_element(By.ID, "submit-extra")
    extra.send_keys("{not json")
    browser.find_element(By.ID, "submit-button").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "submit-error").is_displayed(), 5, "the JSON error")
    assert "Extra JSON" in text_of(browser, "submit-error")
    extra.clear()
    extra.send_keys('{"hyperparameters": {"batch_size": 0}}')
    browser.find_element(By.ID, "submit-button").click()
    wait_for(browser, lambda d: "batch_size" in text_of(d, "submit-error"), 10, "the API's refusal", smeltd)
    message = text_of(browser, "submit-error")
    assert "refused" in message and "HTTP 400" in message and "hyperparameters.batch_size" in message, message


def test_submit_creates_job_and_cancel(browser, smeltd, training_job):
    open_page(browser, smeltd, ADMIN_KEY)
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#submit-training-file option[value^='file-']")
             and d.find_elements(By.CSS_SELECTOR, "#submit-model option[value='tiny']"), 15, "the form's choices")
    browser.find_element(By.ID, "submit-suffix").send_keys("fromform")
    browser.find_element(By.ID, "submit-extra").send_keys(
        '{"model_init": "random", "data": {"max_seq_len": 32}, "hyperparameters": {"max_steps": 5000}}')
    browser.find_element(By.ID, "submit-button").click()
    wait_for(browser, lambda d: "created ftjob-" in text_of(d, "submit-result"), 10, "the created job", smeltd)
    job_id = text_of(browser, "submit-result").split()[-1]
    wait_for(browser, lambda d: text_of(d, "detail-id") == job_id, 10, "the new job's detail")
    status, job = smeltd.request("GET", f"/v1/fine_tuning/jobs/{job_id}")
    assert status == 200 and job["user_provided_suffix"] == "fromform"
    assert job["spec"]["hyperparameters"]["max_steps"] == 5000  # the extra JSON was merged in
    wait_for(browser, lambda d: not d.find_element(By.ID, "pause-job").get_attribute("disabled"), 10,
             "the pause button")
    assert browser.find_element(By.ID, "resume-job").get_attribute("disabled"), "resume needs a paused job"
    browser.find_element(By.ID, "pause-job").click()
    wait_for(browser, lambda d: "paused" in text_of(d, "detail-status"), 10, "the paused status", smeltd)
    wait_for(browser, lambda d: not d.find_element(By.ID, "resume-job").get_attribute("disabled"), 10,
             "the resume button")
    browser.find_element(By.ID, "resume-job").click()
    wait_for(browser, lambda d: any(s in text_of(d, "detail-status") for s in ("queued", "running")), 10,
             "the resumed job", smeltd)
    browser.execute_script("window.confirm = () => true")
    wait_for(browser, lambda d: not d.find_element(By.ID, "cancel-job").get_attribute("disabled"), 10,
             "the cancel button")
    browser.find_element(By.ID, "cancel-job").click()
    wait_for(browser, lambda d: "cancelled" in text_of(d, "detail-status"), 10, "the cancelled status", smeltd)
    # a second cancel is refused by the API, and the page says why (the button is
    # disabled by now, so press it the way its click handler does)
    browser.execute_script("jobAction('cancel')")
    wait_for(browser, lambda d: d.find_element(By.ID, "detail-error").is_displayed(), 10, "the 409 message")
    assert "409" in text_of(browser, "detail-error") and "already ended" in text_of(browser, "detail-error")


def test_rl_charts_appear_with_rl_metrics(browser, smeltd):
    open_page(browser, smeltd)
    figures = ("reward-chart-figure", "kl-chart-figure", "length-chart-figure")
    # #job-detail itself is hidden here (no job open): look at the figures' own flag
    assert all(browser.find_element(By.ID, f).get_property("hidden") for f in figures)
    browser.execute_script("absorbMetrics(1, {type: 'train', loss: 1.5, reward: 0.25, kl: 0.01, response_length: 17});"
                           "absorbMetrics(2, {step: 2, train_loss: 1.4, reward_mean: 0.5, kl: 0.02});")
    wait_for(browser, lambda d: d.find_element(By.ID, "reward-chart").get_attribute("data-points") == "2", 5,
             "two reward points")
    assert not any(browser.find_element(By.ID, f).get_property("hidden") for f in figures)
    assert browser.find_element(By.ID, "kl-chart").get_attribute("data-points") == "2"
    assert browser.find_element(By.ID, "length-chart").get_attribute("data-points") == "1"
    assert browser.find_element(By.ID, "loss-chart").get_attribute("data-points") == "2"


def test_grpo_reward_curves_and_samples(browser, smeltd):
    """A GRPO job's train lines (reward, mismatch, completion length), its held-out reward and
    accuracy, and the samples line of an iteration: the curves on the reward, KL and length
    charts, the newest samples in a table (text shown as text)."""
    open_page(browser, smeltd)
    assert browser.find_element(By.ID, "samples-figure").get_property("hidden")
    browser.execute_script(
        "absorbMetrics(0, {type: 'eval', val_reward: 0.5, val_accuracy: 0.5});"
        "absorbMetrics(1, {type: 'train', loss: 0.0, reward: 0.25, kl: 0.0, 'rollout/logprob_diff_mean': 1e-7,"
        " 'completions/mean_length': 4});"
        "absorbMetrics(1, {type: 'samples', samples: [{prompt: '<b>1+1=</b>', completion: '002', reward: 1,"
        " finish_reason: 'stop'}]});"
        "absorbMetrics(2, {type: 'samples', samples: [{prompt: '2+2=', completion: '004', reward: 1, finish_reason:"
        " 'stop'}, {prompt: '2+3=', completion: '006', reward: 0, finish_reason: 'length'}]});")
    wait_for(browser, lambda d: d.find_element(By.ID, "reward-chart").get_attribute("data-points") == "3", 5,
             "three points on the reward chart")
    assert browser.find_element(By.ID, "kl-chart").get_attribute("data-points") == "2"
    assert browser.find_element(By.ID, "length-chart").get_attribute("data-points") == "1"
    assert not browser.find_element(By.ID, "samples-figure").get_property("hidden")
    # #job-detail is hidden here (no job open): read the rows' text content
    rows = [r.get_attribute("textContent") for r in browser.find_elements(By.CSS_SELECTOR, "#samples tbody tr")]
    assert len(rows) == 2 and "004" in rows[0] and "length" in rows[1], rows


def test_dpo_metrics_share_the_loss_chart(browser, smeltd):
    """A DPO job's reward margin and preference accuracy (train lines / step events, and
    val_ on evaluations) are drawn on the loss chart, against a second axis."""
    open_page(browser, smeltd)
    browser.execute_script(
        "absorbMetrics(1, {type: 'train', loss: 0.69, 'rewards/margins': 0.0, 'rewards/accuracies': 0.375});"
        "absorbMetrics(2, {step: 2, train_loss: 0.71, 'rewards/margins': -0.03, 'rewards/accuracies': 0.5});"
        "absorbMetrics(3, {step: 3, valid_loss: 0.68, 'val_rewards/margins': 0.04, 'val_rewards/accuracies': 0.625});")
    # train loss 2, margin 2, accuracy 2, validation loss 1, its margin 1 and accuracy 1
    wait_for(browser, lambda d: d.find_element(By.ID, "loss-chart").get_attribute("data-points") == "9", 5,
             "nine points on the loss chart")
    last = browser.find_element(By.ID, "loss-chart-last").get_attribute("textContent")
    assert "reward margin " in last and "preference accuracy " in last, last
    axes = browser.execute_script(
        "const c = charts.loss.chart; return c && c.data.datasets.map((d) => [d.label, d.yAxisID]);")
    if axes is not None:  # Chart.js loaded: the margin and accuracy use the second axis
        assert dict(axes) == {"train": "y", "validation": "y", "reward margin": "y2", "preference accuracy": "y2",
                              "val. reward margin": "y2", "val. preference accuracy": "y2"}, axes
    assert all(browser.find_element(By.ID, f).get_property("hidden")
               for f in ("reward-chart-figure", "kl-chart-figure")), "the RL charts stay hidden"


def set_control(browser, element_id, value, event):
    """Sets an input's or select's value and fires its event (the RL view is inside the hidden job detail)."""
    browser.execute_script("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                           "e.dispatchEvent(new Event(arguments[2]));", element_id, value, event)


def rows_text(browser, table_id):
    return [[c.get_attribute("textContent") for c in r.find_elements(By.TAG_NAME, "td")]
            for r in browser.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr")]


def series_names(browser, chart):
    return browser.execute_script(f"return charts[{json.dumps(chart)}].series.map((s) => s.name)")


EVIL = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def test_rl_view_samples_search_and_escaping(browser, smeltd):
    """Per-grader curves, the reward band, the samples of each iteration by iteration and
    search, the reward errors and the evaluation runs, from records as the trainer writes
    them; a completion with markup is shown as text."""
    open_page(browser, smeltd)
    assert browser.find_element(By.ID, "rl-view").get_property("hidden")
    browser.execute_script(
        "absorbMetrics(0, {type: 'eval', val_reward: 0.25, val_accuracy: 0, val_samples: 8, val_samples_failed: 1,"
        " val_samples_graded_zero: 0});"
        "absorbMetrics(1, {type: 'train', loss: 0, reward: 0.5, reward_min: 0, reward_max: 1, reward_std: 0.5,"
        " 'rewards/exact/mean': 0.25, 'rewards/reward/mean': 0.75});"
        "absorbMetrics(1, {type: 'samples', rewards: [0, 1, 1, null], rewards_total: 4, samples: ["
        " {prompt: 'apple>', completion: 'elppa', reward: 1, finish_reason: 'stop', line: 1,"
        "  scores: {exact: 1, reward: 1}},"
        " {prompt: 'pear>', completion: arguments[0], reward: 0, finish_reason: 'length', line: 2,"
        "  scores: {exact: 0, reward: null}}]});"
        "absorbMetrics(2, {type: 'samples', rewards: [0.5, 0.5], samples: [{prompt: 'plum>', completion: 'mulp',"
        " reward: null, finish_reason: 'stop', line: 3, scores: {exact: null, reward: null}}]});"
        "absorbMetrics(2, {type: 'sample_errors', count: 1, failed: 1, zeroed: 0, errors: [{line: 3,"
        " error: 'endpoint: HTTP 500 from the reward service'}]});", EVIL)
    assert not browser.find_element(By.ID, "rl-view").get_property("hidden")
    assert series_names(browser, "reward") == ["val. reward", "val. accuracy", "reward", "exact", "reward (grader)"]
    assert series_names(browser, "dist") == ["min", "mean", "max", "std"]
    # the newest iteration first: its sample failed, its error listed
    rows = rows_text(browser, "samples")
    assert rows == [["2", "plum>", "mulp", "failed", "exact failed, reward failed", "stop"]], rows
    assert rows_text(browser, "sample-errors") == [["2", "3", "failed: left out",
                                                    "endpoint: HTTP 500 from the reward service"]]
    wait_for(browser, lambda d: d.find_element(By.ID, "hist-chart").get_attribute("data-points") == "2", 5,
             "the histogram of iteration 2")
    set_control(browser, "samples-step", "1", "change")
    rows = rows_text(browser, "samples")
    assert [r[2] for r in rows] == ["elppa", EVIL] and rows[1][4] == "exact 0, reward failed", rows
    assert browser.find_element(By.ID, "sample-errors").get_property("hidden"), "iteration 1 had no reward errors"
    wait_for(browser, lambda d: d.find_element(By.ID, "hist-chart").get_attribute("data-points") == "4", 5,
             "the histogram of iteration 1")
    assert "1 failed" in browser.find_element(By.ID, "hist-chart-last").get_attribute("textContent")
    # markup in a completion is text: no element made from it, nothing ran
    assert not browser.find_elements(By.CSS_SELECTOR, "#samples img, #samples script")
    assert browser.execute_script("return window.__pwned === undefined")
    # search over every iteration: prompt, completion, grader and error text
    set_control(browser, "samples-step", "all", "change")
    assert len(rows_text(browser, "samples")) == 3
    set_control(browser, "samples-search", "PPA", "input")
    assert [r[1] for r in rows_text(browser, "samples")] == ["apple>"]
    assert "1 of 3 samples match" in browser.find_element(By.ID, "samples-count").get_attribute("textContent")
    set_control(browser, "samples-search", "<script>", "input")
    assert [r[1] for r in rows_text(browser, "samples")] == ["pear>"]
    set_control(browser, "samples-search", "http 500", "input")
    assert rows_text(browser, "samples") == [] and len(rows_text(browser, "sample-errors")) == 1
    set_control(browser, "samples-search", "", "input")
    assert rows_text(browser, "eval-runs") == [["0", "0.25", "0", "8", "1", "0"]]


def test_ppo_critic_chart(browser, smeltd):
    open_page(browser, smeltd)
    assert browser.find_element(By.ID, "critic-chart-figure").get_property("hidden")
    browser.execute_script("absorbMetrics(1, {type: 'train', reward: 0.5, 'critic/vf_loss': 0.3,"
                           " 'critic/vpred_mean': 0.1, 'critic/returns_mean': 0.4, 'critic/vf_clipfrac': 0.05})")
    assert not browser.find_element(By.ID, "critic-chart-figure").get_property("hidden")
    assert series_names(browser, "critic") == ["value loss", "value mean", "returns mean", "value clip fraction"]


def test_grpo_job_rl_view(browser, smeltd, grpo_job):
    """A real GRPO job: the page's curves, evaluation runs and samples are the API's."""
    job_id = grpo_job["id"]
    job = smeltd.wait_job(job_id, ("succeeded", "failed", "cancelled"), timeout=TRAIN_WAIT_S)
    assert job["status"] == "succeeded", (job, smeltd.read_log())
    status, page = smeltd.request("GET", f"/v1/fine_tuning/jobs/{job_id}/metrics?limit=1000")
    assert status == 200, page
    lines = [dict(r["data"], type=r["type"], step=r["step"]) for r in page["data"]]
    train = [x for x in lines if x["type"] == "train"]
    samples = {x["step"]: x for x in lines if x["type"] == "samples"}
    evals = sorted(x["step"] for x in lines if x["type"] == "eval")
    graders = sorted({k.split("/")[1] for x in train for k in x if k.startswith("rewards/") and k.endswith("/mean")})
    assert len(train) == 3 and sorted(samples) == [1, 2, 3] and evals and graders, (train, samples, evals)

    browser.get_log("browser")  # drop what earlier tests left there
    open_page(browser, smeltd, ADMIN_KEY)
    row = f'#jobs-table tr[data-job-id="{job_id}"]'
    wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, row).click() or True, 15, "a click on the RL job")
    wait_for(browser, lambda d: d.find_element(By.ID, "rl-view").is_displayed(), 15, "the RL view", smeltd)
    wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#samples-step option")) == 5, 15,
             "newest, all and the 3 iterations in the selector", smeltd)
    names = series_names(browser, "reward")
    assert set(names) == {"reward", "val. reward", "val. accuracy", *graders}, names
    assert set(series_names(browser, "dist")) == {"min", "mean", "max", "std"}
    assert int(browser.find_element(By.ID, "reward-chart").get_attribute("data-points")) >= 3 * (1 + len(graders))
    set_control(browser, "samples-step", "2", "change")
    want = samples[2]["samples"]
    rows = rows_text(browser, "samples")
    assert [r[1:3] for r in rows] == [[x["prompt"], x["completion"]] for x in want], (rows, want)
    for r, x in zip(rows, want):
        assert r[4] == ", ".join(f"{g} " + browser.execute_script("return fmtNumber(arguments[0])", v)
                                 for g, v in x["scores"].items()), (r, x)
    assert browser.find_element(By.ID, "hist-chart").get_attribute("data-points") == str(len(samples[2]["rewards"]))
    needle = want[0]["prompt"]
    set_control(browser, "samples-search", needle, "input")
    shown = rows_text(browser, "samples")
    assert shown and all(needle.lower() in (r[1] + r[2]).lower() for r in shown), shown
    shown_evals = [int(r[0].split()[0]) for r in rows_text(browser, "eval-runs")]
    assert set(evals) <= set(shown_evals), (evals, shown_evals)
    # the page's first load may still use the refused key an earlier test left in localStorage
    errors = [e for e in severe_console_errors(browser) if "401 (Unauthorized)" not in e.get("message", "")]
    assert not errors, errors


def test_page_works_without_chartjs(browser, smeltd, training_job):
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*vendor/chart.js"]})
    try:
        open_page(browser, smeltd, ADMIN_KEY)
        assert browser.execute_script("return typeof Chart") == "undefined"
        assert not browser.find_element(By.ID, "charts-unavailable").get_property("hidden")
        browser.execute_script("absorbMetrics(3, {type: 'train', loss: 2.5})")
        wait_for(browser, lambda d: d.find_element(By.ID, "loss-chart").get_attribute("data-points") == "1", 5,
                 "the point counted without Chart.js")
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr"), 15, "jobs", smeltd)
    finally:
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
        browser.get_log("browser")  # drop the blocked request's console error


def test_openapi_served(smeltd):
    with urllib.request.urlopen(smeltd.base_url + "/v1/openapi.json", timeout=10) as res:
        assert res.status == 200 and "json" in res.headers["Content-Type"]
        served = json.loads(res.read())
    assert served == json.loads((ROOT / "server" / "web" / "openapi.json").read_text())


def test_sse_parser(browser, smeltd):
    open_page(browser, smeltd)
    rec = browser.execute_script(
        "return parseSseRecord('id: ftevent-7\\nevent: fine_tuning.job.event\\ndata: {\"a\":\\ndata: 1}')")
    assert rec == {"id": "ftevent-7", "event": "fine_tuning.job.event", "data": ['{"a":', "1}"]}
    assert browser.execute_script("return parseSseRecord(': keep-alive')") is None
    end = browser.execute_script("return parseSseRecord('event: end\\r\\ndata: {}')")
    assert end["event"] == "end"


# Wraps the page's fetch: the events list comes back empty (so the stream starts at the
# first event), and the first stream's body ends after one record, as a dropped
# connection would. Each stream request's Last-Event-ID is recorded.
CUT_STREAM_JS = r"""
window.__streamCalls = [];
const realFetch = window.fetch.bind(window);
window.fetch = async (url, opts) => {
  const headers = (opts && opts.headers) || {};
  if (String(url).includes('/events') && headers['Accept'] === 'text/event-stream') {
    window.__streamCalls.push(headers['Last-Event-ID'] || null);
    const res = await realFetch(url, opts);
    if (window.__streamCalls.length > 1) return res;
    const reader = res.body.getReader();
    const dec = new TextDecoder(), enc = new TextEncoder();
    let buf = '';
    const body = new ReadableStream({async pull(ctrl) {
      while (!buf.includes('\n\n')) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += dec.decode(value, {stream: true});
      }
      ctrl.enqueue(enc.encode(buf.slice(0, buf.indexOf('\n\n') + 2)));
      reader.cancel();
      ctrl.close();
    }});
    return new Response(body, {status: res.status, headers: res.headers});
  }
  if (String(url).includes('/events?'))
    return new Response('{"object":"list","data":[],"has_more":false}',
                        {status: 200, headers: {'Content-Type': 'application/json'}});
  return realFetch(url, opts);
};
"""


def test_stream_resumes_with_last_event_id(browser, smeltd, training_job):
    job_id = training_job["id"]
    open_page(browser, smeltd, ADMIN_KEY)
    browser.execute_script(CUT_STREAM_JS)
    row = f'#jobs-table tr[data-job-id="{job_id}"]'
    wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, row).click() or True, 15, "a click on the job")
    wait_for(browser, lambda d: "ended" in text_of(d, "stream-status"), TRAIN_WAIT_S, "the stream's end", smeltd)
    calls = browser.execute_script("return window.__streamCalls")
    assert len(calls) >= 2 and calls[0] is None, calls
    assert calls[1] and calls[1].startswith("ftevent-"), f"the reconnect did not send Last-Event-ID: {calls}"
    shown = [e.get_attribute("data-event-id") for e in browser.find_elements(By.CSS_SELECTOR, "#events li")]
    status, page = smeltd.request("GET", f"/v1/fine_tuning/jobs/{job_id}/events?limit=1000")
    assert status == 200
    assert len(shown) == len(set(shown)), "an event is listed twice"
    assert set(shown) == {e["id"] for e in page["data"]}, "events went missing across the reconnect"
    assert int(browser.find_element(By.ID, "loss-chart").get_attribute("data-points")) >= 30
