"""Schedules: a near cron expression fires and creates a job; forbid/replace policies; a
firing missed while smeltd was down fires once at start, not once per missed minute."""
import json
import os
import sqlite3
import time

from conftest import SMALL_JOB, TRAIN_FILE, Smeltd


def small(file_id, **hp):
    job = json.loads(json.dumps(dict(SMALL_JOB, training_file=file_id)))
    job["hyperparameters"].update(hp)
    return job


def runs(server, sid):
    status, page = server.request("GET", "/v1/fine_tuning/schedules/%s/runs" % sid)
    assert status == 200, page
    return page["data"]


def test_cron_fires_and_creates_a_job(smeltd, train_file_id):
    status, sched = smeltd.request("POST", "/v1/fine_tuning/schedules",
                                   {"name": "every minute", "cron": "* * * * *", "job": small(train_file_id)})
    assert status == 200, sched
    assert sched["next_run_at"] - time.time() <= 61
    deadline = time.time() + 75
    while time.time() < deadline and not runs(smeltd, sched["id"]):
        time.sleep(0.5)
    fired = runs(smeltd, sched["id"])
    assert fired and fired[0]["trigger"] == "cron" and fired[0]["outcome"] == "created", fired
    job = smeltd.wait_job(fired[0]["job_id"], {"succeeded", "failed"})
    assert job["status"] == "succeeded" and job["schedule_id"] == sched["id"]
    status, sched2 = smeltd.request("GET", "/v1/fine_tuning/schedules/" + sched["id"])
    assert sched2["next_run_at"] > fired[0]["fired_at"]
    status, _ = smeltd.request("POST", "/v1/fine_tuning/schedules/" + sched["id"], {"suspended": True})
    assert status == 200


def test_policies_forbid_and_replace(smeltd, train_file_id):
    long_job = small(train_file_id, max_steps=100000, n_epochs=100)
    status, sched = smeltd.request("POST", "/v1/fine_tuning/schedules",
                                   {"cron": "0 0 1 1 *", "job": long_job, "concurrency_policy": "forbid"})
    assert status == 200, sched
    sid = sched["id"]
    status, first = smeltd.request("POST", "/v1/fine_tuning/schedules/%s/trigger" % sid)
    assert status == 200 and first["outcome"] == "created", first
    status, second = smeltd.request("POST", "/v1/fine_tuning/schedules/%s/trigger" % sid)
    assert second["outcome"] == "skipped" and first["job_id"] in second["message"], second
    status, _ = smeltd.request("POST", "/v1/fine_tuning/schedules/" + sid, {"concurrency_policy": "replace"})
    assert status == 200
    status, third = smeltd.request("POST", "/v1/fine_tuning/schedules/%s/trigger" % sid)
    assert third["outcome"] == "created"
    status, old = smeltd.request("GET", "/v1/fine_tuning/jobs/" + first["job_id"])
    assert old["status"] == "cancelled"
    smeltd.request("POST", "/v1/fine_tuning/jobs/%s/cancel" % third["job_id"])
    smeltd.wait_devices_free()
    status, body = smeltd.request("DELETE", "/v1/fine_tuning/schedules/" + sid)
    assert status == 200 and body["deleted"]
    assert smeltd.request("GET", "/v1/fine_tuning/schedules/" + sid)[0] == 404


def test_missed_firing_fires_once_after_restart(start_smeltd):
    server = start_smeltd()
    status, f = server.upload(TRAIN_FILE)
    status, sched = server.request("POST", "/v1/fine_tuning/schedules",
                                   {"cron": "* * * * *", "job": small(f["id"]), "suspended": True})
    assert status == 200
    server.kill()
    # smeltd was down for an hour: 60 firings were missed
    db = sqlite3.connect(os.path.join(server.data_dir, "smelt.db"))
    db.execute("UPDATE schedules SET suspended = 0, next_fire_at = ? WHERE id = ?",
               (int(time.time()) - 3600, sched["id"]))
    db.commit()
    db.close()
    restarted = Smeltd(server.data_dir, server.models_dir).start()
    try:
        deadline = time.time() + 10
        while time.time() < deadline and not runs(restarted, sched["id"]):
            time.sleep(0.2)
        time.sleep(1.0)
        fired = runs(restarted, sched["id"])
        assert len(fired) == 1, fired
        assert fired[0]["scheduled_for"] < time.time() - 3000
        restarted.wait_job(fired[0]["job_id"], {"succeeded", "failed"})
    finally:
        restarted.kill()
