"""OpenAI's grader endpoints through smeltd, driven by the official `openai` client:
`client.fine_tuning.alpha.graders.validate(grader=...)` and `.run(grader=...,
model_sample=..., item=...)` for string_check, text_similarity (scores checked against
hand-computed values), multi (sub_rewards), python (a grader that scores and one that
raises: reward 0 with python_grader_runtime_error), a template naming what the item
lacks (invalid_variable_error and the message), and bad graders refused as
openai.BadRequestError with `param` naming the field. Then raw HTTP: a body that is not
JSON, no grader, an unknown type, no key. Python cases skip where bubblewrap (or the
namespaces it needs) is missing, as the unit tests do."""
import shutil

import openai
import pytest

from conftest import ADMIN_KEY

RUN = "/v1/fine_tuning/alpha/graders/run"
VALIDATE = "/v1/fine_tuning/alpha/graders/validate"

EXACT = {"type": "string_check", "name": "exact", "operation": "eq",
         "input": "{{sample.output_text}}", "reference": "{{item.reference_answer}}"}
CLOSE = {"type": "text_similarity", "name": "close", "evaluation_metric": "fuzzy_match",
         "input": "{{sample.output_text}}", "reference": "{{item.reference_answer}}"}
ERROR_FLAGS = ("formula_parse_error", "invalid_variable_error", "model_grader_parse_error",
               "model_grader_refusal_error", "model_grader_server_error", "other_error",
               "python_grader_runtime_error", "python_grader_server_error", "sample_parse_error",
               "truncated_observation_error", "unresponsive_reward_error")


@pytest.fixture(scope="module")
def client(smeltd):
    return openai.OpenAI(base_url=smeltd.base_url + "/v1", api_key=ADMIN_KEY, max_retries=0)


def raised(answer):
    """The names of the error flags the answer raises."""
    errors = answer.metadata.errors.model_dump(by_alias=True)
    return {k for k in ERROR_FLAGS if errors[k]}


def test_validate_answers_the_grader_as_smelt_reads_it(client):
    got = client.fine_tuning.alpha.graders.validate(grader=EXACT)
    assert got.grader.type == "string_check"
    assert got.grader.model_dump(exclude_none=True) == EXACT
    multi = {"type": "multi", "name": "m", "graders": {"exact": EXACT, "close": CLOSE},
             "calculate_output": "0.8 * exact + 0.2 * close"}
    got = client.fine_tuning.alpha.graders.validate(grader=multi)
    assert got.grader.type == "multi"
    assert got.grader.calculate_output == multi["calculate_output"]
    assert set(got.grader.graders) == {"exact", "close"}


def test_run_string_check(client):
    r = client.fine_tuning.alpha.graders.run(grader=EXACT, model_sample="Paris",
                                             item={"reference_answer": "Paris"})
    assert r.reward == 1.0
    assert r.metadata.name == "exact" and r.metadata.type == "string_check"
    assert r.metadata.scores == {"string_check": 1.0}
    assert r.metadata.execution_time >= 0
    assert r.sub_rewards == {} and r.model_grader_token_usage_per_model == {}
    assert raised(r) == set()
    r = client.fine_tuning.alpha.graders.run(grader=dict(EXACT, operation="ilike"), model_sample="It is PARIS.",
                                             item={"reference_answer": "paris"})
    assert r.reward == 1.0
    r = client.fine_tuning.alpha.graders.run(grader=EXACT, model_sample="Lyon", item={"reference_answer": "Paris"})
    assert r.reward == 0.0 and raised(r) == set()


def test_run_text_similarity_against_hand_computed_scores(client):
    # rapidfuzz's ratio: 1 - indel distance / total length; "kitten" and "sitting" share
    # "ittn": distance 6 + 7 - 2 * 4 = 5, score 8/13.
    r = client.fine_tuning.alpha.graders.run(grader=CLOSE, model_sample="kitten", item={"reference_answer": "sitting"})
    assert r.reward == pytest.approx(8 / 13, abs=1e-12)
    # rouge-score's ROUGE-1 F-measure: 3 shared unigrams, precision 3/3, recall 3/4.
    rouge = dict(CLOSE, evaluation_metric="rouge_1")
    r = client.fine_tuning.alpha.graders.run(grader=rouge, model_sample="The cat sat",
                                             item={"reference_answer": "the cat sat down"})
    assert r.reward == pytest.approx(2 * 1 * 0.75 / 1.75, abs=1e-12)


def test_run_multi_gives_sub_rewards(client):
    multi = {"type": "multi", "name": "both", "graders": {"exact": EXACT, "close": CLOSE},
             "calculate_output": "0.8 * exact + 0.2 * close"}
    # " 37" against " 037": ratio 2 * 3 / 7
    r = client.fine_tuning.alpha.graders.run(grader=multi, model_sample=" 37", item={"reference_answer": " 037"})
    assert r.sub_rewards["exact"] == 0.0
    assert r.sub_rewards["close"] == pytest.approx(6 / 7, abs=1e-12)
    assert r.reward == pytest.approx(0.2 * 6 / 7, abs=1e-12)
    assert r.metadata.type == "multi" and r.metadata.name == "both"
    assert r.metadata.scores["multi"] == pytest.approx(r.reward)
    r = client.fine_tuning.alpha.graders.run(grader=multi, model_sample=" 037", item={"reference_answer": " 037"})
    assert r.reward == pytest.approx(1.0) and r.sub_rewards == {"exact": 1.0, "close": 1.0}


def test_a_missing_item_field_is_an_error_in_the_metadata(client):
    r = client.fine_tuning.alpha.graders.run(grader=EXACT, model_sample="Paris", item={"answer": "Paris"})
    assert r.reward == 0.0
    assert raised(r) == {"invalid_variable_error"}
    message = r.metadata.model_extra["error_message"]
    assert "{{item.reference_answer}}" in message and "no field" in message
    # the item is read as a job reads a training row: its messages are the prompt
    grader = dict(EXACT, reference="{{item.messages}}")
    r = client.fine_tuning.alpha.graders.run(grader=grader, model_sample="x",
                                             item={"messages": [{"role": "user", "content": "x"}]})
    assert raised(r) == {"invalid_variable_error"}


def test_bad_graders_are_refused_naming_the_field(client):
    cases = [
        ({"type": "multi", "graders": {"acc": dict(EXACT, operation="contains")}, "calculate_output": "acc"},
         "grader.graders.acc.operation"),
        (dict(CLOSE, evaluation_metric="cosine"), "grader.evaluation_metric"),
        ({"type": "multi", "graders": {"a": EXACT}, "calculate_output": "a +"}, "grader.calculate_output"),
    ]
    for grader, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.fine_tuning.alpha.graders.validate(grader=grader)
        assert e.value.param == param, (grader, e.value.body)
        assert e.value.body["message"].startswith(param), e.value.body
        with pytest.raises(openai.BadRequestError) as e:
            client.fine_tuning.alpha.graders.run(grader=grader, model_sample="x")
        assert e.value.param == param
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.alpha.graders.run(grader=EXACT, model_sample="x", item=["not", "a", "row"])
    assert e.value.param == "item"


def test_model_graders_validate_but_run_only_in_a_job(client):
    judge = {"type": "score_model", "name": "s", "model": "gpt-4o", "range": [0, 10],
             "input": [{"role": "user", "content": "Rate {{sample.output_text}} from 0 to 10"}]}
    client.fine_tuning.alpha.graders.validate(grader=judge)
    cases = [(dict(judge, range=[3, 1]), "grader.range"),
             ({"type": "label_model", "name": "l", "model": "gpt-4o", "input": [], "labels": ["a"],
               "passing_labels": ["a"]}, "grader.input"),
             ({"type": "label_model", "name": "l", "model": "m", "input": judge["input"], "labels": ["a"],
               "passing_labels": ["b"]}, "grader.passing_labels")]
    for grader, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.fine_tuning.alpha.graders.validate(grader=grader)
        assert e.value.param == param, (grader, e.value.body)
    for grader in (judge, cases[1][0]):
        with pytest.raises(openai.BadRequestError) as e:
            client.fine_tuning.alpha.graders.run(grader=grader, model_sample="x")
        assert e.value.param == "grader.type" and "only inside a job" in e.value.body["message"]


# ---- python graders ----

SCORES = "def grade(sample, item) -> float:\n    return len(sample['output_text']) / len(item['word'])\n"
RAISES = "def grade(sample, item) -> float:\n    raise ValueError('no luck')\n"


@pytest.fixture(scope="module")
def python_ok(client):
    if shutil.which("bwrap") is None:
        pytest.skip("no bubblewrap: python graders cannot run here")
    try:
        client.fine_tuning.alpha.graders.validate(grader={"type": "python", "name": "p", "source": SCORES})
    except openai.BadRequestError as e:
        if "cannot run on this machine" in e.body["message"]:
            pytest.skip("no sandbox here: " + e.body["message"])
        raise


def test_a_python_grader_scores(client, python_ok):
    got = client.fine_tuning.alpha.graders.validate(grader={"type": "python", "name": "p", "source": SCORES})
    assert got.grader.type == "python" and got.grader.source == SCORES
    r = client.fine_tuning.alpha.graders.run(grader={"type": "python", "name": "len", "source": SCORES},
                                             model_sample="abc", item={"word": "abcd"})
    assert r.reward == 0.75
    assert r.metadata.type == "python" and r.metadata.name == "len"
    assert raised(r) == set()


def test_a_python_grader_that_raises_scores_0_with_the_flag(client, python_ok):
    r = client.fine_tuning.alpha.graders.run(grader={"type": "python", "name": "bad", "source": RAISES},
                                             model_sample="abc")
    assert r.reward == 0.0
    assert raised(r) == {"python_grader_runtime_error"}
    assert "ValueError: no luck" in r.metadata.errors.python_grader_runtime_error_details


def test_a_python_grader_that_does_not_define_grade_is_refused(client, python_ok):
    with pytest.raises(openai.BadRequestError) as e:
        client.fine_tuning.alpha.graders.validate(grader={"type": "python", "name": "p", "source": "x = 1\n"})
    assert e.value.param == "grader.source"


def test_a_python_grader_in_a_multi(client, python_ok):
    multi = {"type": "multi", "graders": {"exact": EXACT, "py": {"type": "python", "name": "py", "source": SCORES}},
             "calculate_output": "exact + py"}
    r = client.fine_tuning.alpha.graders.run(grader=multi, model_sample="ab",
                                             item={"reference_answer": "ab", "word": "abcd"})
    assert r.sub_rewards == {"exact": 1.0, "py": 0.5}
    assert r.reward == 1.5


# ---- raw HTTP ----

def test_raw_http_refusals(smeltd):
    status, body = smeltd.request("POST", RUN, raw=b"{not json", headers={"Content-Type": "application/json"})
    assert status == 400 and body["error"]["code"] == "invalid_json"
    status, body = smeltd.request("POST", VALIDATE, raw=b"", headers={"Content-Type": "application/json"})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = smeltd.request("POST", RUN, {"model_sample": "x"})
    assert status == 400 and body["error"]["param"] == "grader"
    status, body = smeltd.request("POST", RUN, {"grader": EXACT})
    assert status == 400 and body["error"]["param"] == "model_sample"
    status, body = smeltd.request("POST", VALIDATE, {"grader": {"type": "regex_match"}})
    assert status == 400 and body["error"]["param"] == "grader.type"
    assert "unknown grader type" in body["error"]["message"]
    status, body = smeltd.request("POST", RUN, {"grader": EXACT, "model_sample": "x", "samples": []})
    assert status == 400 and body["error"]["param"] == "samples"
    status, body = smeltd.request("POST", RUN, {"grader": EXACT, "model_sample": "x"}, key=None)
    assert status == 401


def test_raw_http_answer_has_every_field(smeltd):
    status, body = smeltd.request("POST", RUN, {"grader": EXACT, "model_sample": "a",
                                                "item": {"reference_answer": "a"}})
    assert status == 200
    assert set(body) == {"reward", "metadata", "sub_rewards", "model_grader_token_usage_per_model"}
    assert set(body["metadata"]) == {"name", "type", "errors", "execution_time", "scores", "token_usage",
                                     "sampled_model_name", "error_message"}
    assert set(body["metadata"]["errors"]) == set(ERROR_FLAGS) | {
        "model_grader_server_error_details", "python_grader_runtime_error_details", "python_grader_server_error_type"}
