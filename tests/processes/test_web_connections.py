"""The web process's database connections are bounded (issue: one daphne process serving 8
API clients held 80+ PostgreSQL connections and at 16 clients answered 500 "too many
clients already", which starves the workers too).

A real daphne process serving ``config.asgi:application`` on PostgreSQL borrows at most
``DATABASE_POOL_MAX_SIZE`` connections from its pool whatever the number of clients, and
a request that waits in vain for one is answered 503 with ``Retry-After``, never 500.
PostgreSQL only: the embedded default's SQLite has no connections to run out of.
"""

from __future__ import annotations

import concurrent.futures
import threading
import urllib.error
import urllib.request
from collections import Counter

import psycopg
import pytest
from django.contrib.auth.models import Group, User
from django.db import connection

from api.tokens import token_create
from tests.browser.server import Daphne
from tests.harness import database_url, wait_until, worker_env

pytestmark = [pytest.mark.django_db(transaction=True)]

WEB = "durable-web"  # the web process's application_name (config/settings.py)


@pytest.fixture
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("the web's connection pool is PostgreSQL's (SQLite has no connections)")


@pytest.fixture
def token(postgres_only) -> str:
    user = User.objects.create_user("pool-client")
    user.groups.add(Group.objects.get(name="operator"))
    _, text = token_create(user=user, name="pool", scopes=["runs:read"])
    return text


def web_connections(*, waiting_on_a_lock: bool = False) -> int:
    """Connections the web process holds now (all, or those waiting on a lock)."""
    lock = " AND wait_event_type = 'Lock'" if waiting_on_a_lock else ""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            f"SELECT count(*) FROM pg_stat_activity WHERE application_name = %s{lock}", [WEB]
        )
        return int(cursor.fetchone()[0])


def get(url: str, token: str) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def serve(tmp_path, **pool: str) -> Daphne:
    crash = tmp_path / "crash"
    crash.mkdir()
    daphne = Daphne(worker_env(crash, **pool), tmp_path / "daphne.log")
    return daphne.start()


def stop(server: Daphne) -> None:
    """Stop daphne and wait until PostgreSQL has seen its connections go."""
    server.stop()
    wait_until(
        lambda: web_connections() == 0, timeout=30, what="daphne's connections to end", sweep=False
    )


def test_many_clients_share_the_web_process_pool_and_all_get_answers(tmp_path, token):
    server = serve(tmp_path, DATABASE_POOL_MAX_SIZE="3")
    most = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal most
        try:
            while not done.is_set():
                most = max(most, web_connections())
                done.wait(0.02)
        finally:
            connection.close()  # this thread's own connection

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(24) as clients:
            answers = list(
                clients.map(
                    lambda _: get(f"{server.url}/api/v1/runs?limit=20", token)[0], range(96)
                )
            )
    finally:
        done.set()
        sampler.join(5)
        stop(server)
    assert Counter(answers) == {200: 96}, server.tail()
    assert 1 <= most <= 3, f"the web process held {most} connections (its pool has 3)"


def test_a_request_that_waits_in_vain_for_a_connection_is_a_503_with_retry_after(tmp_path, token):
    """One connection, held by a request blocked on a table lock this test holds: the next
    request waits DATABASE_POOL_TIMEOUT for it and is answered 503; the blocked one ends
    200 once the lock goes."""
    server = serve(tmp_path, DATABASE_POOL_MAX_SIZE="1", DATABASE_POOL_TIMEOUT="0.5")
    url = f"{server.url}/api/v1/runs?limit=5"
    try:
        get(url, token)  # the pool's one connection is open, the token known
        with (
            concurrent.futures.ThreadPoolExecutor(1) as first_client,
            psycopg.connect(database_url().replace("postgres://", "postgresql://")) as locker,
        ):
            locker.execute("LOCK TABLE durable_run IN ACCESS EXCLUSIVE MODE")  # in a transaction
            first = first_client.submit(get, url, token)

            def blocked() -> bool:
                return web_connections(waiting_on_a_lock=True) == 1

            wait_until(blocked, timeout=30, what="the first request waits on the lock", sweep=False)
            status, headers = get(url, token)
            locker.rollback()
            assert status == 503, server.tail()
            assert headers.get("Retry-After") == "1"
            assert first.result(timeout=60)[0] == 200
    finally:
        stop(server)


def test_connections_the_database_ended_are_not_lent_to_the_next_requests(tmp_path, token):
    """A database restart (or a failover, or an administrator) ends the pool's idle
    connections; the next requests must not borrow them and answer 500 (a load run saw 10
    requests answered 500 while CI restarted PostgreSQL). The pool checks a connection
    as it lends it (CONN_HEALTH_CHECKS, as Django does without the pool) and opens
    another in its place: every request is answered 200."""
    server = serve(tmp_path, DATABASE_POOL_MAX_SIZE="4", DATABASE_POOL_MIN_SIZE="4")
    url = f"{server.url}/api/v1/runs?limit=5"
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as clients:
            assert set(clients.map(lambda _: get(url, token)[0], range(8))) == {200}
        wait_until(
            lambda: web_connections() >= 2, timeout=30, what="the pool's connections", sweep=False
        )
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s",
                [WEB],
            )
            assert cursor.fetchone()[0] >= 2  # the pool's idle connections, ended
        wait_until(
            lambda: web_connections() == 0, timeout=30, what="the ended connections", sweep=False
        )
        answers = [get(url, token)[0] for _ in range(8)]
    finally:
        stop(server)
    assert Counter(answers) == {200: 8}, server.tail()
