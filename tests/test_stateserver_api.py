"""The state server's budget API through Django's test client (issue 4): every endpoint,
the budget rule, and bad requests (HTTP 400 with a JSON error, nothing changed)."""
import json

import pytest

from esync import config

pytestmark = pytest.mark.django_db


def post(client, url, body):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json")


def report(client, rank, round_, seconds, job="job1"):
    return post(client, f"/jobs/{job}/budget/",
                {"rank": rank, "round": round_, "time_per_iteration": seconds})


@pytest.fixture
def job(client):
    response = post(client, "/jobs/job1/", {"workers": 4, "max_local_steps": 8})
    assert response.status_code == 201, response.content
    return response.json()


def state(client, job="job1"):
    response = client.get(f"/jobs/{job}/")
    assert response.status_code == 200
    return response.json()


def stored(client, job="job1"):
    """The job's state without what changes with the clock alone."""
    body = state(client, job)
    for device in body["devices"]:
        del device["seconds_since_report"]
    return body


def test_init_creates_one_device_per_rank(client, job):
    assert job["workers"] == 4 and job["max_local_steps"] == 8 and job["round"] == 0
    assert [d["rank"] for d in job["devices"]] == [0, 1, 2, 3]
    assert all(d["budget"] == 1 and d["reported_at"] is None for d in job["devices"])
    # initialising again with the same settings changes nothing (worker 0 restarted)
    again = post(client, "/jobs/job1/", {"workers": 4, "max_local_steps": 8})
    assert again.status_code == 200 and again.json()["created_at"] == job["created_at"]


def test_round_one_gives_everyone_one(client, job):
    for rank in range(4):
        assert report(client, rank, 1, None).json()["budget"] == 1


def test_budgets_follow_the_slowest_device(client, job):
    times = {0: 0.01, 1: 0.01, 2: 0.04, 3: 0.04}  # two fast, two four times slower
    for rank in range(4):
        report(client, rank, 1, None)
    for rank, seconds in times.items():  # round 2: reported one by one
        report(client, rank, 2, seconds)
    got = {rank: report(client, rank, 3, seconds).json()["budget"]
           for rank, seconds in times.items()}
    assert got == {0: 4, 1: 4, 2: 1, 3: 1}
    status = state(client)
    assert status["round"] == 3
    assert [d["budget"] for d in status["devices"]] == [4, 4, 1, 1]
    assert [d["round"] for d in status["devices"]] == [3, 3, 3, 3]
    assert all(d["reports"] == 3 and d["reported_at"] for d in status["devices"])


def test_a_round_time_sets_every_budget_the_slowest_included(client):
    """With round_time, each device runs about round_time / its time per iteration (at
    least 1, at most the cap), instead of the slowest device setting the round."""
    created = post(client, "/jobs/timed/", {"workers": 3, "max_local_steps": 16,
                                            "round_time": 0.2})
    assert created.status_code == 201 and created.json()["round_time"] == 0.2
    times = {0: 0.01, 1: 0.04, 2: 0.5}
    for rank, seconds in times.items():
        report(client, rank, 1, seconds, job="timed")
    got = {rank: report(client, rank, 2, seconds, job="timed").json()["budget"]
           for rank, seconds in times.items()}
    assert got == {0: 16, 1: 5, 2: 1}  # 20 capped at 16; 5; 0.4 rounds up to at least 1
    assert state(client, "timed")["round_time"] == 0.2
    # without it, the slowest device sets the round
    assert post(client, "/jobs/untimed/", {"workers": 1}).json()["round_time"] is None


def test_the_devices_coordination_lengthens_the_round_to_its_share(client):
    """With coordination_share 0.1, a round's computing lasts at least 9 times the most
    any living device reported its synchronisation to cost: here 20 ms, so 180 ms,
    longer than the slowest device's 30 ms iteration. Without the share (the paper's
    rule) the same reports give the slowest device's iteration."""
    for name, share in (("shared", 0.1), ("paper", None)):
        body = {"workers": 3, "max_local_steps": 32}
        if share is not None:
            body["coordination_share"] = share
        created = post(client, f"/jobs/{name}/", body)
        assert created.status_code == 201 and \
            created.json()["coordination_share"] == (share or 0.0)
        costs = {0: 0.02, 1: 0.005, 2: None}  # rank 2 has not measured one yet
        for rank, seconds in enumerate([0.01, 0.03, 0.03]):
            answer = post(client, f"/jobs/{name}/budget/",
                          {"rank": rank, "round": 2, "time_per_iteration": seconds,
                           **({} if costs[rank] is None else {"coordination": costs[rank]})})
            assert answer.status_code == 200, answer.content
        got = [post(client, f"/jobs/{name}/budget/",
                    {"rank": rank, "round": 3, "time_per_iteration": seconds,
                     "coordination": 0.02}).json()["budget"]
               for rank, seconds in enumerate([0.01, 0.03, 0.03])]
        assert got == ([18, 6, 6] if share else [3, 1, 1]), (name, got)
        devices = state(client, name)["devices"]
        assert [d["coordination"] for d in devices] == [0.02, 0.02, 0.02]


def test_a_device_below_the_least_speed_gets_budget_0_until_the_fast_one_is_gone(client):
    """least_speed 0.15: the device 8 times slower than the fastest sits out (budget 0),
    the one 4 times slower trains and sets the round; once the fast device stops asking
    (dead, two rounds behind), the slow one is fast enough again."""
    created = post(client, "/jobs/least/", {"workers": 3, "max_local_steps": 32,
                                            "least_speed": 0.15})
    assert created.status_code == 201 and created.json()["least_speed"] == 0.15
    times = [0.01, 0.04, 0.08]
    for round_ in (2, 3):
        got = [report(client, rank, round_, t, job="least").json()["budget"]
               for rank, t in enumerate(times)]
    assert got == [4, 1, 0]
    assert [d["budget"] for d in state(client, "least")["devices"]] == [4, 1, 0]
    for round_ in (4, 5):  # rank 0 asks no more
        got = [report(client, rank, round_, times[rank], job="least").json()["budget"]
               for rank in (1, 2)]
    assert got == [2, 1]
    # a job without the field: every device trains (the paper's rule)
    post(client, "/jobs/everyone/", {"workers": 2})
    assert state(client, "everyone")["least_speed"] == 0.0
    for round_ in (2, 3):
        got = [report(client, rank, round_, t, job="everyone").json()["budget"]
               for rank, t in enumerate([0.01, 0.1])]
    assert got == [10, 1]


def test_a_device_sitting_out_measures_again_and_its_second_time_replaces_its_first(client):
    """least_speed 0.2: a GPU whose first iteration measured its warm-up (1 s, against a
    CPU worker's 0.1 s) sits out, reporting no time (null) while it does; its only time
    a warm-up, it measures again in its 2nd round out, and, still loaded then (1 s),
    every 4th round out, its iteration fitting in the CPU worker's round (64 x 0.1 s)
    (budget 1, measuring: its delta weighs nothing). That measurement (0.005 s)
    replaces its average, of the device before it sat out: it trains at once, and the
    CPU worker, 20 times slower, sits out; the GPU, training alone, runs rounds as long
    as the CPU worker's iteration while its coordination is not measured (20)."""
    post(client, "/jobs/warm/", {"workers": 2, "max_local_steps": 64, "least_speed": 0.2})
    gpu = []
    for round_ in range(1, 13):
        # the CPU worker, its first iteration shorter, asks first
        report(client, 1, round_, None if round_ == 1 else 0.1, job="warm")
        said = gpu[-1] if gpu else None  # the GPU reports a time after rounds it computed
        seconds = None if round_ == 1 or said and said["budget"] == 0 else \
            1.0 if round_ <= 4 else 0.005
        gpu.append(report(client, 0, round_, seconds, job="warm").json())
    got = [(g["budget"], g["measuring"]) for g in gpu]
    assert got[:7] == [(1, True), (0, False), (1, True), (0, False), (1, True),
                       (20, False), (20, False)], got
    assert gpu[5]["smoothed_time_per_iteration"] == 0.005
    cpu = state(client, "warm")["devices"][1]
    assert cpu["budget"] == 0 and cpu["rounds_out"] >= 5


@pytest.mark.parametrize("slow, measured", [(0.08, [3, 5, 9, 17]),
                                            (0.06, [3, 5, 9, 13, 17])])
def test_a_device_far_too_slow_measures_again_ever_more_rarely_though_it_fits(client, slow,
                                                                              measured):
    """Beside a device of 0.01 s an iteration (rounds of 64), one at 1/8 of its speed
    (0.08 s) is far below the least speed (0.2): though its iteration fits in the round
    it measures again in its 2nd round out (its first time a warm-up), then its 4th, 8th
    and 16th, not every 4th; one at 1/6 (0.06 s), close to it, every 4th."""
    job = f"far{int(slow * 100)}"
    post(client, f"/jobs/{job}/", {"workers": 2, "max_local_steps": 64, "least_speed": 0.2})
    for rank in range(2):
        report(client, rank, 1, None, job=job)
    report(client, 0, 2, 0.01, job=job)
    out = []
    for round_ in range(2, 20):
        computed = round_ == 2 or out[-1]["budget"] == 1
        out.append(report(client, 1, round_, slow if computed else None, job=job).json())
        report(client, 0, round_ + 1, 0.01, job=job)
    measured_in = [k for k, o in enumerate(out, start=2) if o["budget"] == 1]
    assert measured_in == measured, [(o["budget"], o["measuring"]) for o in out]
    assert all(o["measuring"] for o in out if o["budget"] == 1)


def test_a_device_whose_iteration_outlasts_the_round_measures_again_ever_more_rarely(client):
    """A device 1,000 times slower than the one that trains (its iteration 10 s, the
    round 16 x 0.01 s) would hold every round it measures in up: it measures again
    in its 4th, 8th and 16th round out, not every 4th."""
    post(client, "/jobs/far/", {"workers": 2, "max_local_steps": 16, "least_speed": 0.2})
    for rank in range(2):
        report(client, rank, 1, None, job="far")
    report(client, 0, 2, 0.01, job="far")
    out = []
    for round_ in range(2, 20):
        out.append(report(client, 1, round_, 10.0 if round_ == 2 else None,
                          job="far").json())
        report(client, 0, round_ + 1, 0.01, job="far")
    measured_in = [k for k, o in enumerate(out, start=2) if o["budget"] == 1]
    assert measured_in == [5, 9, 17], [(o["budget"], o["measuring"]) for o in out]


@pytest.mark.parametrize("rounds_out, fits, measures", [
    (3, True, False), (4, True, True), (8, True, True), (12, True, True), (13, True, False),
    (4, False, True), (8, False, True), (12, False, False), (16, False, True),
    (2, True, False)])
def test_when_a_device_sitting_out_measures_again(rounds_out, fits, measures):
    from esync.algorithms.esync.budget import remeasures

    assert remeasures(rounds_out, fits) is measures
    # its only time its first iteration's (a warm-up): again in its 2nd round out too
    assert remeasures(rounds_out, fits, warm_up=True) is (measures or (rounds_out, fits) ==
                                                          (2, True))
    # far below the least speed: at every doubling, fitting or not
    assert remeasures(rounds_out, fits, far=True) is (rounds_out >= 4 and
                                                      rounds_out & (rounds_out - 1) == 0)


def test_a_device_far_below_the_least_speed_is_one_that_would_need_a_third_more():
    from esync.algorithms.esync.budget import far_below

    # least speed 0.2 of the fastest (0.1 s an iteration): far below 0.15, 2/3 s and up
    assert far_below(0.8, [0.1, 0.8, None], 0.2)  # 1/8
    assert not far_below(0.6, [0.1, 0.6], 0.2)  # 1/6: close to the least speed
    assert not far_below(0.8, [0.1, 0.8], 0.0)  # no least speed: nobody sits out


def test_a_device_s_first_time_and_its_first_after_sitting_out_are_taken_as_they_are():
    from esync.algorithms.esync.budget import smooth

    assert smooth(None, 1.5, 0.3) == 1.5
    assert smooth(1.0, 0.5, 0.3) == pytest.approx(0.85)  # averaged: noise, or a change
    assert smooth(1.0, 3.0, 0.3) == pytest.approx(1.6)
    assert smooth(1.5, 0.01, 0.3, fresh=True) == 0.01  # measured again after sitting out


def test_until_all_have_measured_the_budget_is_one(client, job):
    report(client, 0, 2, 0.01)
    assert report(client, 1, 2, 0.05).json()["budget"] == 1  # ranks 2, 3 not measured


def test_with_a_least_speed_a_device_measured_trains_before_the_others_report(client):
    """Round 2, least speed 0.2: the fast device, measured, asks before the slow ones
    reported: it trains at once, the others counted as sitting out, for as long as one
    that would train (at least 0.2 of its speed) could take for its first iteration,
    rather than wait for them idle; the next, 2 times slower, fills what is left of
    that round; the last, 16 times slower, sits out."""
    post(client, "/jobs/second/", {"workers": 3, "max_local_steps": 16, "least_speed": 0.2})
    for rank in range(3):
        report(client, rank, 1, None, job="second")
    got = [report(client, rank, 2, t, job="second").json() for rank, t in
           enumerate([1.0, 2.0, 16.0])]
    # 5 x 1 s for the first (1 / least speed); the second trains what is left of it
    # (about 2 x 2 s); the third sits out
    assert [(g["budget"], g["measuring"]) for g in got] == [(5, False), (2, False), (0, False)]
    # the two that train while the third has not measured: open rounds (budget.opens)
    assert [g["open"] for g in got] == [True, True, False]
    retry = report(client, 0, 2, 1.0, job="second").json()
    assert (retry["budget"], retry["open"]) == (5, False)  # a retry: the budget holds
    got = [report(client, rank, 3, t, job="second").json()["budget"] for rank, t in
           enumerate([1.0, 2.0, 16.0])]
    assert got == [2, 1, 0]  # the slowest (1/16) sits out; the round is the 0.02 s one's


def test_a_device_that_has_not_asked_yet_is_starting_not_gone(client):
    """Rank 0 measured its first iteration and asks for round 2 before rank 1 asked for
    its round 1 (a process starting late, under load): rank 1 is counted, not measured
    yet, so rank 0's round is open, as long as one that would train could take for its
    first iteration (5 x 0.01 s); counted as gone, rank 0 trained alone: budget 1, the
    round not open, and it waited for rank 1's first iteration. Once someone asks for
    round 3, a device that has not asked for round 1 is gone."""
    post(client, "/jobs/late/", {"workers": 2, "max_local_steps": 64, "least_speed": 0.2})
    report(client, 0, 1, None, job="late")
    fast = report(client, 0, 2, 0.01, job="late").json()
    assert (fast["budget"], fast["open"]) == (5, True), fast
    post(client, "/jobs/gone/", {"workers": 2, "max_local_steps": 64, "least_speed": 0.2})
    report(client, 0, 1, None, job="gone")
    report(client, 0, 2, 0.01, job="gone")
    alone = report(client, 0, 3, 0.01, job="gone").json()
    assert (alone["budget"], alone["open"]) == (1, False), alone


def test_an_open_round_s_interim_time_weighs_the_devices_that_measure_after_it(client):
    """16x7 as it started once: the fast device's first iteration, a warm-up, measured
    0.2 s, a slow device's 1.0 s (16 times 0.045 s would be 0.72 s of computing; its
    warm-up costs less than the fast one's, relatively). Weighed against the warm-up
    the slow device would train round 2 (budget 1), holding the fast device's round for
    its iteration; weighed against the fast device's time so far in its open round
    (0.045 s, reported `interim`), it sits out. The interim report changes the time
    only, answers the round's budget, and is refused for another round or as null."""
    post(client, "/jobs/interim/", {"workers": 3, "max_local_steps": 64, "least_speed": 0.2})
    for rank in range(3):
        report(client, rank, 1, None, job="interim")
    fast = report(client, 0, 2, 0.2, job="interim").json()
    assert (fast["budget"], fast["open"]) == (5, True)
    weighed_by_warm_up = report(client, 1, 2, 1.0, job="interim").json()
    assert weighed_by_warm_up["budget"] == 1, weighed_by_warm_up

    def interim(rank, round_, seconds):
        return post(client, "/jobs/interim/budget/", {
            "rank": rank, "round": round_, "time_per_iteration": seconds, "interim": True})

    answer = interim(0, 2, 0.045)
    assert answer.status_code == 200, answer.content
    assert (answer.json()["budget"], answer.json()["open"]) == (5, False)
    device = state(client, "interim")["devices"][0]
    assert (device["round"], device["reports"], device["smoothed_time_per_iteration"]) == \
        (2, 2, 0.045)  # its round and reports as they were
    weighed_by_speed = report(client, 2, 2, 1.0, job="interim").json()
    assert weighed_by_speed["budget"] == 0, weighed_by_speed
    for bad in (interim(0, 3, 0.04), interim(0, 2, None),
                post(client, "/jobs/interim/budget/", {"rank": 0, "round": 2,
                                                       "time_per_iteration": 0.04,
                                                       "interim": "yes"})):
        assert bad.status_code == 400 and "interim" in bad.json()["error"], bad.content
    assert state(client, "interim")["devices"][0]["smoothed_time_per_iteration"] == 0.045


def test_a_device_that_sat_out_on_its_warm_up_alone_measures_again_in_its_2nd_round_out(
        client):
    """4x7's start: weighed by its first iteration (0.5 s, a warm-up) against the fast
    device's interim time (0.05 s) a device at 1/4 of its speed looks at 1/10 and sits
    round 2 out; it measures again in round 3, its iteration fitting in the fast
    device's round alone (as long as its warm-up, 10 x 0.05 s, while the coordination
    is not measured), not after 4 rounds out, and trains from round 4 on its time after
    the warm-up (0.2 s, 1/4)."""
    post(client, "/jobs/warm4/", {"workers": 2, "max_local_steps": 64, "least_speed": 0.2})
    for rank in range(2):
        report(client, rank, 1, None, job="warm4")
    assert report(client, 0, 2, 0.2, job="warm4").json()["open"] is True
    post(client, "/jobs/warm4/budget/", {"rank": 0, "round": 2, "time_per_iteration": 0.05,
                                         "interim": True})
    assert report(client, 1, 2, 0.5, job="warm4").json()["budget"] == 0
    assert report(client, 0, 3, 0.05, job="warm4").json()["budget"] == 10
    again = report(client, 1, 3, None, job="warm4").json()
    assert (again["budget"], again["measuring"]) == (1, True), again
    assert report(client, 1, 4, 0.2, job="warm4").json()["budget"] == 1
    assert report(client, 0, 4, 0.05, job="warm4").json()["budget"] == 4
    assert state(client, "warm4")["devices"][1]["times_reported"] == 2


def test_budget_is_capped_and_at_least_one(client):
    post(client, "/jobs/capped/", {"workers": 2, "max_local_steps": 3})
    report(client, 0, 1, 0.001, job="capped")
    assert report(client, 1, 1, 1.0, job="capped").json()["budget"] == 1
    assert report(client, 0, 2, 0.001, job="capped").json()["budget"] == 3
    post(client, "/jobs/default-cap/", {"workers": 1})
    assert state(client, "default-cap")["max_local_steps"] == config.MAX_LOCAL_STEPS


def test_a_device_s_second_time_replaces_its_first_a_warm_up(client, job):
    """A device's first time is of its first iteration alone, a warm-up: its second
    is taken as it is, later ones averaged in."""
    for rank in range(4):
        report(client, rank, 1, None)
    for round_, seconds in ((2, 0.03), (3, 0.01), (4, 0.02)):
        report(client, 0, round_, seconds)
    smoothed = state(client)["devices"][0]["smoothed_time_per_iteration"]
    assert smoothed == pytest.approx(0.7 * 0.01 + 0.3 * 0.02)


def test_one_noisy_round_does_not_swing_the_budget(client, job):
    for round_ in range(1, 6):  # steady: 4x
        for rank, seconds in enumerate([0.01, 0.01, 0.04, 0.04]):
            budget = report(client, rank, round_, seconds).json()["budget"]
    assert budget == 1
    # one round where a fast device measures 3x its usual time
    assert report(client, 0, 6, 0.03).json()["budget"] >= 2
    device = state(client)["devices"][0]
    assert device["time_per_iteration"] == 0.03
    assert 0.01 < device["smoothed_time_per_iteration"] < 0.03


def test_asking_again_for_the_same_round_gives_the_same_answer(client, job):
    for rank, seconds in enumerate([0.01, 0.01, 0.04, 0.04]):
        report(client, rank, 1, seconds)
    first = report(client, 0, 2, 0.01).json()
    retry = report(client, 0, 2, 0.5).json()  # a retry after a lost answer
    assert retry == first
    assert state(client)["devices"][0]["reports"] == 2


def test_status_lists_every_job(client, job):
    post(client, "/jobs/other.job_2/", {"workers": 2})
    report(client, 1, 1, 0.02, job="other.job_2")
    for url in ("/", "/status/"):
        body = client.get(url).json()
        names = [j["job"] for j in body["jobs"]]
        assert names == ["job1", "other.job_2"]
        other = body["jobs"][1]
        assert other["round"] == 1 and other["devices"][1]["time_per_iteration"] == 0.02
        assert other["devices"][1]["seconds_since_report"] >= 0


BAD_REPORTS = [
    ("not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ({"round": 2, "time_per_iteration": 0.1}, "'rank' is missing"),
    ({"rank": 0, "time_per_iteration": 0.1}, "'round' is missing"),
    ({"rank": 0, "round": 2}, "'time_per_iteration' is missing"),
    ({"rank": "0", "round": 2, "time_per_iteration": 0.1}, "'rank' must be an integer"),
    ({"rank": True, "round": 2, "time_per_iteration": 0.1}, "'rank' must be an integer"),
    ({"rank": -1, "round": 2, "time_per_iteration": 0.1}, "'rank' must be an integer"),
    ({"rank": 0, "round": 0, "time_per_iteration": 0.1}, "'round' must be an integer"),
    ({"rank": 0, "round": 2.5, "time_per_iteration": 0.1}, "'round' must be an integer"),
    ({"rank": 0, "round": 2, "time_per_iteration": "fast"}, "'time_per_iteration' must be"),
    ({"rank": 0, "round": 2, "time_per_iteration": -0.1}, "'time_per_iteration' must be"),
    ({"rank": 0, "round": 2, "time_per_iteration": 0}, "'time_per_iteration' must be"),
    ('{"rank": 0, "round": 2, "time_per_iteration": NaN}', "'time_per_iteration' must be"),
    ({"rank": 0, "round": 2, "time_per_iteration": 0.1, "coordination": 0},
     "'coordination' must be a positive number"),
    ({"rank": 0, "round": 2, "time_per_iteration": 0.1, "coordination": "slow"},
     "'coordination' must be a positive number"),
    ({"rank": 4, "round": 2, "time_per_iteration": 0.1}, "'rank' 4 is outside job"),
    ({"rank": 0, "round": 1, "time_per_iteration": 0.1}, "'round' 1 is in the past"),
    # a round far ahead of the job's latest (2) would make that rank's requests "past"
    ({"rank": 1, "round": 11, "time_per_iteration": 0.1},
     "field 'round' must be an integer in 1..10 (at most 8 beyond round 2"),
    ({"rank": 0, "round": 2**31 - 1, "time_per_iteration": None},
     "field 'round' must be an integer in 1..10 (at most 8 beyond round 2, the latest any "
     "worker of job 'job1' asked for), got 2147483647"),
]


@pytest.mark.parametrize("body, message", BAD_REPORTS)
def test_bad_reports_get_400_and_change_nothing(client, job, body, message):
    report(client, 0, 2, 0.02)
    before = stored(client)
    response = post(client, "/jobs/job1/budget/", body)
    assert response.status_code == 400, response.content
    assert message in response.json()["error"]
    assert stored(client) == before


def test_a_round_up_to_8_ahead_of_the_job_is_taken_and_the_first_may_be_any(client, job):
    """Workers ask at most 1 round ahead (2 rejoining); the job's first request may be
    any round: a job resumed on a state server that lost its rows starts at its
    checkpoint's round."""
    assert report(client, 0, 500, None).status_code == 200
    assert report(client, 1, 508, None).status_code == 200
    response = report(client, 2, 517, None)
    assert response.status_code == 400, response.content
    assert "'round' must be an integer in 1..516" in response.json()["error"]
    assert [d["round"] for d in state(client)["devices"]] == [500, 508, 0, 0]


BAD_INITS = [
    ({}, "'workers' is missing"),
    ({"workers": 0}, "'workers' must be an integer"),
    ({"workers": "4"}, "'workers' must be an integer"),
    ({"workers": 4, "max_local_steps": 0}, "'max_local_steps' must be an integer"),
    ({"workers": 2}, "already exists with 4 workers"),
    ({"workers": 4, "max_local_steps": 9}, "already exists"),
    ({"workers": 4, "max_local_steps": 8, "round_time": 1.0}, "round_time None"),
    ({"workers": 4, "round_time": 0}, "'round_time' must be a number of seconds"),
    ({"workers": 4, "round_time": "1"}, "'round_time' must be a number of seconds"),
    ({"workers": 4, "round_time": True}, "'round_time' must be a number of seconds"),
    ({"workers": 4, "round_time": 1e9}, "'round_time' must be a number of seconds"),
    ({"workers": 4, "max_local_steps": 8, "coordination_share": 0.1},
     "coordination_share 0"),
    ({"workers": 4, "coordination_share": 1}, "'coordination_share' must be a number in [0, 1)"),
    ({"workers": 4, "coordination_share": -0.1}, "'coordination_share' must be a number"),
    ({"workers": 4, "coordination_share": "0.1"}, "'coordination_share' must be a number"),
    ({"workers": 4, "coordination_share": True}, "'coordination_share' must be a number"),
    ({"workers": 4, "max_local_steps": 8, "least_speed": 0.15}, "least_speed 0"),
    ({"workers": 4, "least_speed": 1.5}, "'least_speed' must be a number in [0, 1]"),
    ({"workers": 4, "least_speed": -0.1}, "'least_speed' must be a number in [0, 1]"),
    ({"workers": 4, "least_speed": "0.1"}, "'least_speed' must be a number"),
    ({"workers": 4, "least_speed": None}, "'least_speed' must be a number"),
    ("{", "not valid JSON"),
]


@pytest.mark.parametrize("body, message", BAD_INITS)
def test_bad_inits_get_400_and_change_nothing(client, job, body, message):
    response = post(client, "/jobs/job1/", body)
    assert response.status_code == 400, response.content
    assert message in response.json()["error"]
    assert state(client) == job


def test_bad_job_ids_unknown_jobs_methods_and_urls(client, job):
    response = post(client, "/jobs/bad%20name/", {"workers": 2})
    assert response.status_code == 400 and "job id" in response.json()["error"]
    response = report(client, 0, 1, 0.1, job="nosuch")
    assert response.status_code == 404 and "no job 'nosuch'" in response.json()["error"]
    assert client.get("/jobs/nosuch/").status_code == 404
    response = client.get("/jobs/job1/budget/")
    assert response.status_code == 405 and response["Allow"] == "POST"
    assert client.delete("/jobs/job1/").status_code == 405
    assert client.post("/status/").status_code == 405
    response = client.get("/no/such/page")
    assert response.status_code == 404 and "no such endpoint" in response.json()["error"]
    assert [j["job"] for j in client.get("/").json()["jobs"]] == ["job1"]


def test_every_device_of_a_round_gets_the_round_length_its_first_request_fixed(client):
    """Once every device has measured, a round's length is fixed by its first request
    and given to each device of the round, though the reports that come meanwhile move
    the slowest time and the most coordination: equal devices get equal budgets. (Asked
    device by device, 16 equal devices got budgets of 1 and 3 in one round and those
    given 1 waited two iterations.)"""
    created = post(client, "/jobs/planned/", {"workers": 3, "max_local_steps": 32,
                                              "coordination_share": 0.1})
    assert created.status_code == 201
    for round_ in (2, 3):
        for rank in range(3):
            post(client, "/jobs/planned/budget/", {"rank": rank, "round": round_,
                                                   "time_per_iteration": 0.03,
                                                   "coordination": 0.01})
    # round 4: rank 0 asks first (0.09 s of computing: 3 iterations); rank 1 then
    # reports a spike of coordination and a slower iteration
    got = [post(client, "/jobs/planned/budget/",
                {"rank": rank, "round": 4, "time_per_iteration": seconds,
                 "coordination": cost}).json()["budget"]
           for rank, seconds, cost in ((0, 0.03, 0.01), (1, 0.031, 0.05), (2, 0.03, 0.01))]
    assert got == [3, 3, 3]
    # the next round's first request takes what came in: the spike lengthens it for all
    got = [post(client, "/jobs/planned/budget/",
                {"rank": rank, "round": 5, "time_per_iteration": 0.03,
                 "coordination": 0.01}).json()["budget"] for rank in (2, 1, 0)]
    assert len(set(got)) == 1 and got[0] > 3, got
