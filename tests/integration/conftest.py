"""Fixtures for the integration tests: a real smeltd (with its embedded agent running
real smelt-trainer workers) on loopback, in a temporary data directory
(tests/smeltd_harness.py). Each test module gets a fresh server unless it asks for its
own through `start_smeltd`."""
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from smeltd_harness import (ADMIN_KEY, BUILD, ROOT, SMALL_JOB, TRAIN_FILE, VAL_FILE,  # noqa: E402,F401
                            Smeltd, make_models_dir, prompts_rows)


@pytest.fixture
def start_smeltd():
    """Factory: start_smeltd(data_dir=None, extra_args=(), env=None, launcher=()) -> Smeltd;
    all stopped at the end."""
    servers, tmps = [], []

    def start(data_dir=None, models_dir=None, extra_args=(), env=None, launcher=()):
        if data_dir is None:
            tmp = tempfile.mkdtemp(prefix="smelt-it-")
            tmps.append(tmp)
            data_dir = os.path.join(tmp, "data")
            os.makedirs(data_dir)
            models_dir = make_models_dir(tmp)
        s = Smeltd(data_dir, models_dir, extra_args, env, launcher)
        servers.append(s)
        return s.start()

    yield start
    for s in servers:
        s.kill()
    for t in tmps:
        shutil.rmtree(t, ignore_errors=True)


@pytest.fixture(scope="module")
def smeltd():
    tmp = tempfile.mkdtemp(prefix="smelt-it-")
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    s = Smeltd(data_dir, make_models_dir(tmp)).start()
    yield s
    s.kill()
    if os.environ.get("SMELT_TEST_KEEP"):
        print("kept", tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def train_file_id(smeltd):
    status, f = smeltd.upload(TRAIN_FILE)
    assert status == 200, f
    assert f["status"] == "processed", f
    return f["id"]
