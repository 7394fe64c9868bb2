"""Tests of durable.values.codec, .redaction and .secrets (no database)."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import enum
import json
import math
import re
import socket
import uuid
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cryptography.fernet import Fernet
from django.test import override_settings

from durable.exceptions import DurableConfigurationError, PayloadError
from durable.values import codec
from durable.values.redaction import REDACTED, is_secret_key, matches_secret_pattern, redact_text
from durable.values.secrets import Secret, decrypt, derive_key, encrypt

KEY_A = Fernet.generate_key().decode()
KEY_B = Fernet.generate_key().decode()


def roundtrip(value: Any) -> Any:
    text = codec.encode(value)
    assert isinstance(text, str)
    json.loads(text)  # always valid JSON
    text.encode("utf-8")  # always valid UTF-8
    return codec.decode(text)


# --- exact round trips -----------------------------------------------------------------


def test_decimal_keeps_trailing_zero_and_type():
    out = roundtrip(Decimal("19.90"))
    assert type(out) is Decimal
    assert str(out) == "19.90"
    assert codec.encode(Decimal("19.90")) == '{"$t":"decimal","v":"19.90"}'


@pytest.mark.parametrize("text", ["NaN", "-Infinity", "Infinity", "-0", "1E+2", "0.000"])
def test_decimal_special_values(text):
    out = roundtrip(Decimal(text))
    assert type(out) is Decimal
    assert str(out) == text


def test_aware_datetime_keeps_offset():
    tz = dt.timezone(dt.timedelta(hours=5, minutes=30))
    value = dt.datetime(2024, 3, 1, 12, 30, 15, 123456, tzinfo=tz)
    out = roundtrip(value)
    assert type(out) is dt.datetime
    assert out == value
    assert out.utcoffset() == dt.timedelta(hours=5, minutes=30)
    assert out.isoformat() == "2024-03-01T12:30:15.123456+05:30"


def test_naive_datetime_stays_naive():
    value = dt.datetime(2024, 3, 1, 12, 30)
    out = roundtrip(value)
    assert type(out) is dt.datetime
    assert out.tzinfo is None
    assert out == value


def test_zoneinfo_datetime_keeps_zone_and_fold():
    value = dt.datetime(2024, 11, 3, 1, 30, tzinfo=ZoneInfo("America/New_York"), fold=1)
    out = roundtrip(value)
    assert out.tzinfo == ZoneInfo("America/New_York")
    assert out.fold == 1
    assert out.utcoffset() == dt.timedelta(hours=-5)
    # wall-clock arithmetic behaves as on the original across a DST change
    assert (out + dt.timedelta(days=1)).utcoffset() == (value + dt.timedelta(days=1)).utcoffset()


def test_date_time_timedelta():
    out = roundtrip(
        [
            dt.date(2024, 2, 29),
            dt.time(23, 59, 58, 1),
            dt.timedelta(days=-3, seconds=5, microseconds=7),
        ]
    )
    assert [type(x) for x in out] == [dt.date, dt.time, dt.timedelta]
    assert out == [
        dt.date(2024, 2, 29),
        dt.time(23, 59, 58, 1),
        dt.timedelta(days=-3, seconds=5, microseconds=7),
    ]


def test_aware_time():
    value = dt.time(8, 0, tzinfo=dt.timezone(dt.timedelta(hours=-2)))
    out = roundtrip(value)
    assert type(out) is dt.time
    assert out.utcoffset() == dt.timedelta(hours=-2)


def test_bytes_and_bytearray():
    out = roundtrip(b"\x00\xff")
    assert type(out) is bytes
    assert out == b"\x00\xff"
    assert codec.encode(b"\x00\xff") == '{"$t":"bytes","v":"AP8="}'
    out = roundtrip(bytearray(b"\x01\x02"))
    assert type(out) is bytearray
    assert out == bytearray(b"\x01\x02")


def test_set_of_tuples_and_frozenset():
    out = roundtrip({(1, "a"), (2, "b")})
    assert type(out) is set
    assert out == {(1, "a"), (2, "b")}
    assert all(type(x) is tuple for x in out)
    out = roundtrip(frozenset({1, 2}))
    assert type(out) is frozenset
    assert out == frozenset({1, 2})


def test_unicode_text_is_stored_unescaped():
    text = codec.encode("naïve 😀")
    assert text == '"naïve 😀"'
    assert codec.decode(text) == "naïve 😀"


def test_nested_structure():
    value = {
        "items": [1, 2.5, None, True, "x", (1, [2, (3,)]), {"k": {4, 5}}],
        "when": dt.date(2020, 1, 1),
        "empty": [[], {}, (), set(), frozenset(), ""],
    }
    out = roundtrip(value)
    assert out == value
    assert type(out["items"][5]) is tuple
    assert type(out["items"][5][1]) is list
    assert type(out["items"][5][1][1]) is tuple
    assert type(out["items"][6]["k"]) is set
    assert [type(x) for x in out["empty"]] == [list, dict, tuple, set, frozenset, str]


def test_plain_json_is_stored_as_itself():
    assert (
        codec.encode({"a": [1, 2.5, None, True, "s"], "b": {}})
        == '{"a":[1,2.5,null,true,"s"],"b":{}}'
    )
    assert codec.encode(None) == "null"
    assert codec.encode(False) == "false"
    assert codec.encode(7) == "7"


def test_int_keys_and_tag_key():
    out = roundtrip({1: "a", 2: "b"})
    assert out == {1: "a", 2: "b"}
    assert all(type(k) is int for k in out)
    out = roundtrip({"$t": "tuple", "v": [1, 2]})
    assert out == {"$t": "tuple", "v": [1, 2]}
    assert type(out) is dict
    out = roundtrip({(1, 2): "pair", True: 1, None: 0, "s": 3})
    assert out == {(1, 2): "pair", True: 1, None: 0, "s": 3}
    assert type(next(k for k in out if k is True)) is bool


def test_uuid():
    value = uuid.UUID("12345678-1234-5678-1234-567812345678")
    out = roundtrip(value)
    assert type(out) is uuid.UUID
    assert out == value


def test_big_ints():
    for value in (2**100, -(2**100), 10**5000, -(10**5000) + 1):
        out = roundtrip(value)
        assert type(out) is int
        assert out == value
    assert codec.encode(2**100) == str(2**100)


def test_nan_and_infinities():
    out = roundtrip([math.nan, math.inf, -math.inf, -0.0, 0.1])
    assert all(type(x) is float for x in out)
    assert math.isnan(out[0])
    assert out[1:3] == [math.inf, -math.inf]
    assert math.copysign(1.0, out[3]) == -1.0
    assert out[4] == 0.1
    assert "NaN" not in codec.encode(math.nan)


def test_bool_is_not_int():
    out = roundtrip([True, 1, False, 0])
    assert [type(x) for x in out] == [bool, int, bool, int]


def test_decode_none():
    assert codec.decode(None) is None
    assert codec.decode_for_display(None) is None


# --- determinism -----------------------------------------------------------------------


def test_set_encoding_is_deterministic():
    a = {"b", "a", "c", "10", "9"}
    b = set()
    for item in ["9", "c", "10", "a", "b"]:
        b.add(item)
    assert codec.encode(a) == codec.encode(b)
    assert codec.encode({"b", "a", "c"}) == '{"$t":"set","v":["a","b","c"]}'
    assert codec.encode(frozenset({(2, 1), (1, 2)})) == codec.encode(frozenset({(1, 2), (2, 1)}))


def test_fingerprint_ignores_key_order_and_random_ciphertext():
    one = {"api_key": "sk-test-XYZ123", "n": 1, 3: "x", "s": Secret("p")}
    two = {"s": Secret("p"), 3: "x", "n": 1, "api_key": "sk-test-XYZ123"}
    assert codec.fingerprint(one) == codec.fingerprint(two)
    assert codec.fingerprint(one) != codec.fingerprint({**one, "api_key": "sk-test-OTHER99"})
    assert codec.fingerprint(1) != codec.fingerprint(1.0)


# --- errors ----------------------------------------------------------------------------


def test_unsupported_type_names_the_path():
    conn = socket.socket()
    try:
        with pytest.raises(PayloadError) as err:
            codec.encode({"items": [1, 2, {"conn": conn}]})
    finally:
        conn.close()
    assert str(err.value) == (
        "cannot store value.items[2].conn: type socket is not supported (supported: JSON "
        "types, tuple, set, frozenset, bytes, datetime, date, time, timedelta, Decimal, "
        "UUID, Secret)"
    )


def test_unsupported_object_uses_where_and_odd_keys():
    with pytest.raises(PayloadError, match=r"^cannot store input: type object is not"):
        codec.encode(object(), where="input")
    with pytest.raises(
        PayloadError,
        match=r"^cannot store value\['a b'\]\[0\]\{\.\.\.\}: "
        r"type object",
    ):
        codec.encode({"a b": [frozenset({object()})]})
    with pytest.raises(PayloadError, match=r"^cannot store value\[5\]: type object"):
        codec.encode({5: object()})
    with pytest.raises(PayloadError, match=r"^cannot store value<key #0>: type object"):
        codec.encode({object(): 1})


def test_enum_dataclass_and_subclasses_are_rejected():
    class Color(enum.Enum):
        RED = "red"

    with pytest.raises(PayloadError, match=r"type Color is not supported .*\.value instead"):
        codec.encode([Color.RED])

    @dataclasses.dataclass
    class Point3:
        x: int

    with pytest.raises(PayloadError, match=r"type Point3 .*dataclasses\.asdict\(\)"):
        codec.encode({"p": Point3(1)})
    with pytest.raises(PayloadError, match="subclass of dict"):
        codec.encode(collections.OrderedDict(a=1))
    point = collections.namedtuple("Point", "x y")
    with pytest.raises(PayloadError, match="subclass of tuple"):
        codec.encode(point(1, 2))


def test_lone_surrogates_round_trip_exactly():
    # os.fsdecode(b"\xff") gives "\udcff"; a str may hold surrogates no encoding accepts
    for value in (
        "ab\ud800",
        "\udcff",
        "\ud83d\ude00",
        {"k\ud800": "v\udfff"},
        ["\ud800\\u0041", "\\udcff"],
    ):
        text = codec.encode(value)
        text.encode("utf-8")  # storable as it is
        back = codec.decode(text)
        assert back == value and type(back) is type(value)
    # two lone surrogates that would form a pair stay two code points
    assert len(codec.decode(codec.encode("\ud83d\ude00"))) == 2
    assert codec.decode_for_display(codec.encode({"f": "a\udcff"})) == {"f": "a\\udcff"}


def test_secret_with_a_lone_surrogate_is_refused_naming_where():
    with pytest.raises(
        PayloadError,
        match=r"^cannot store value\.text: str contains a lone "
        r"surrogate at index 14",
    ):
        codec.encode({"text": "sk-abcdefghijk\ud800"})


def test_recursion_guard():
    deep: list[Any] = []
    for _ in range(150):
        deep = [deep]
    assert roundtrip(deep) == deep
    for _ in range(100):
        deep = [deep]
    with pytest.raises(PayloadError, match="nested deeper than 200 levels"):
        codec.encode(deep)


def test_self_reference_is_rejected():
    loop: list[Any] = [1]
    loop.append({"again": loop})
    with pytest.raises(
        PayloadError,
        match=r"^cannot store value\[1\]\.again: this list "
        r"contains itself",
    ):
        codec.encode(loop)
    shared = [1, 2]
    assert roundtrip([shared, shared]) == [[1, 2], [1, 2]]


def test_check_size_names_what_step_and_size():
    with pytest.raises(PayloadError) as err:
        codec.check_size("x" * 2000, what="output", step_id="fetch", limit=1000)
    assert str(err.value) == (
        "step 'fetch': output is 2000 bytes, over the payload limit "
        "of 1000 bytes (DURABLE['MAX_PAYLOAD_BYTES'])"
    )
    assert (err.value.step_id, err.value.size, err.value.limit) == ("fetch", 2000, 1000)
    # multi-byte text is measured in UTF-8 bytes
    with pytest.raises(PayloadError) as err:
        codec.check_size("é" * 600, what="input", limit=1000)
    assert err.value.size == 1200
    codec.check_size("é" * 500, what="input", limit=1000)
    codec.check_size("x" * 1000, what="input", limit=1000)


def test_check_size_default_limit_from_settings(settings):
    settings.DURABLE = {"MAX_PAYLOAD_BYTES": 100}
    codec.check_size("x" * 100, what="output")
    with pytest.raises(PayloadError) as err:
        codec.check_size("x" * 101, what="output")
    assert err.value.limit == 100


def test_dumps_checked(settings):
    settings.DURABLE = {"MAX_PAYLOAD_BYTES": 50}
    assert codec.dumps_checked([1, 2], what="output", step_id="s") == "[1,2]"
    with pytest.raises(PayloadError) as err:
        codec.dumps_checked("y" * 100, what="output", step_id="s")
    assert err.value.step_id == "s"
    assert err.value.size == 102
    with pytest.raises(PayloadError) as err:
        codec.dumps_checked({"x": object()}, what="output", step_id="s")
    assert err.value.step_id == "s"
    assert str(err.value).startswith("step 's': cannot store output.x: type object")


def test_decode_rejects_unknown_tag():
    with pytest.raises(PayloadError, match="unknown tag 'nope'"):
        codec.decode('{"$t":"nope","v":1}')


# --- redaction -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "api_key",
        "X-Api-Key",
        "openai_api_key",
        "Authorization",
        "PASSWORD",
        "db-password",
        "refresh_token",
    ],
)
def test_secret_keys(key):
    assert is_secret_key(key) is True


@pytest.mark.parametrize("key", ["name", "url", "amount", "key"])
def test_not_secret_keys(key):
    assert is_secret_key(key) is False


def test_secret_keys_follow_settings(settings):
    settings.DURABLE = {"REDACT_KEYS": ["ssn"]}
    assert is_secret_key("customer_SSN") is True
    assert is_secret_key("password") is False


@pytest.mark.parametrize(
    "text",
    [
        "Authorization: Basic dXNlcjpwYXNzd29yZA==",
        "authorization=Token abc123",
        "basic YWxhZGRpbjpvcGVuc2VzYW1l",
        "Bearer eyJhbGciOi.xyz",
        "sk_live_abcdefghijklmn",
        "ghp_" + "a" * 36,
        "github_pat_" + "b" * 30,
        "xoxb-1234567890-abcdef",
        "xapp-1-A0123456789",
        "AKIAIOSFODNN7EXAMPLE",
        "ASIAIOSFODNN7EXAMPLE",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n"
        "-----END OPENSSH PRIVATE KEY-----",
        "-----BEGIN PRIVATE KEY----- truncated",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ],
)
def test_default_patterns_cover_the_common_credential_formats(text):
    assert matches_secret_pattern(text) is True
    assert redact_text(f"before {text} after").startswith("before [REDACTED]")


@pytest.mark.parametrize(
    "text",
    [
        "basic settings",
        "Basic Authentication is required",
        "the bearer",
        "a skiff",
        "AKIA",
        "eyJ alone",
        "total_tokens",
        "authorization failed",
    ],
)
def test_default_patterns_leave_prose_alone(text):
    assert matches_secret_pattern(text) is False


def test_secret_patterns():
    assert matches_secret_pattern("key sk-live-abcdef123") is True
    assert matches_secret_pattern("Authorization: bearer abc.def") is True
    assert matches_secret_pattern("AKIAABCDEFGHIJKLMNOP") is True
    assert matches_secret_pattern("a skiff and a bear") is False


def test_redact_text():
    assert redact_text("token sk-live-abcdef123 here") == "token [REDACTED] here"
    assert redact_text("nothing to hide") == "nothing to hide"
    assert REDACTED == "[REDACTED]"


def test_secret_key_value_is_encrypted_and_decrypted():
    text = codec.encode({"api_key": "sk-test-XYZ123", "user": "bob"})
    assert "sk-test-XYZ123" not in text
    assert "XYZ123" not in text
    assert '"user":"bob"' in text
    out = codec.decode(text)
    assert out == {"api_key": "sk-test-XYZ123", "user": "bob"}
    assert type(out["api_key"]) is str


def test_secret_key_without_pattern_match_is_encrypted():
    text = codec.encode({"X-Api-Key": "hunter2", "password": "correct horse"})
    assert "hunter2" not in text
    assert "correct horse" not in text
    assert codec.decode(text) == {"X-Api-Key": "hunter2", "password": "correct horse"}


def test_any_value_under_a_secret_key_is_encrypted_as_a_whole():
    value = {
        "max_tokens": 100,
        "session": {"id": 7, "password": "pw-123", "note": "hi"},
        "api_keys": ["key-one-1", "key-two-2"],
        "cvv": 123,
        "card_number": 4111111111111111,
        "password_hint": None,
        "token": 1.5,
        "secret": (b"raw", True),
    }
    text = codec.encode(value)
    assert '"max_tokens":100' in text  # REDACT_KEYS_ALLOW: a count, not a secret
    # the clear texts are looked for outside the sealed values: a random ciphertext
    # holds "123" or "true" now and then (base64 letters and digits)
    sealed = re.findall(r'\{"\$t":"sealed","v":"[A-Za-z0-9_=-]+"\}', text)
    assert len(sealed) == 6, text
    outside = re.sub(r'"v":"[A-Za-z0-9_=-]+"', '"v":""', text).replace('"max_tokens":100', "")
    for clear in (
        '"id":7',
        '"note":"hi"',
        "pw-123",
        "key-one-1",
        "123",
        "4111111111111111",
        "1.5",
        "true",
        "cmF3",
    ):
        assert clear not in outside, clear
    assert '"password_hint":null' in text  # nothing to hide in None
    out = codec.decode(text)
    assert out == value and type(out["secret"]) is tuple and type(out["cvv"]) is int
    shown = codec.decode_for_display(text)
    assert shown["session"] == shown["api_keys"] == shown["cvv"] == "[REDACTED]"
    assert shown["max_tokens"] == 100


def test_values_under_secret_keys_fingerprint_without_clear_text():
    assert codec.fingerprint({"pin_token": [1, 2]}) == codec.fingerprint({"pin_token": [1, 2]})
    assert codec.fingerprint({"pin_token": [1, 2]}) != codec.fingerprint({"pin_token": [1, 3]})


def test_bearer_token_in_a_list_is_encrypted():
    value = ["hello", ("x", "Bearer abc.def")]
    text = codec.encode(value)
    assert "abc.def" not in text
    assert '"hello"' in text
    out = codec.decode(text)
    assert out == value
    assert type(out[1]) is tuple


def test_token_in_dict_key_is_encrypted():
    value = {"sk-live-abcdef123": 1}
    text = codec.encode(value)
    assert "abcdef123" not in text
    assert codec.decode(text) == value


def test_top_level_token_string_is_encrypted():
    text = codec.encode("sk-live-abcdef123")
    assert "abcdef123" not in text
    assert codec.decode(text) == "sk-live-abcdef123"


def test_secret_wrapper():
    s = Secret("p@ss")
    assert repr(s) == "Secret('***')"
    assert str(s) == "***"
    assert f"{s}" == "***"
    assert s.reveal() == "p@ss"
    assert s == Secret("p@ss")
    assert s != Secret("other")
    assert s != "p@ss"
    assert len({s, Secret("p@ss")}) == 1


def test_secret_round_trips_to_secret():
    value = {"creds": Secret({"user": "bob", "pin": (1, 2)}), "plain": Secret("p@ss")}
    text = codec.encode(value)
    assert "bob" not in text
    assert "p@ss" not in text
    out = codec.decode(text)
    assert type(out["creds"]) is Secret
    assert out["creds"].reveal() == {"user": "bob", "pin": (1, 2)}
    assert type(out["creds"].reveal()["pin"]) is tuple
    assert out["plain"] == Secret("p@ss")


def test_secret_with_unsupported_inner_value():
    with pytest.raises(PayloadError, match=r"^cannot store value\.s\.reveal\(\): type object"):
        codec.encode({"s": Secret(object())})


def test_decode_for_display():
    value = {
        "api_key": "sk-test-XYZ123",
        "s": Secret("x"),
        "note": "Bearer abc.def",
        "when": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "amount": Decimal("19.90"),
        "blob": b"\x00\xff\x10",
        "pair": (1, 2),
        "tags": {"b", "a"},
        "id": uuid.UUID(int=1),
        "wait": dt.timedelta(hours=1, seconds=5),
        "x": math.inf,
        "by_id": {1: "one"},
    }
    shown = codec.decode_for_display(codec.encode(value))
    assert shown == {
        "api_key": "[REDACTED]",
        "s": "[REDACTED]",
        "note": "[REDACTED]",
        "when": "2024-01-02T03:04:05+00:00",
        "amount": "19.90",
        "blob": "<3 bytes>",
        "pair": [1, 2],
        "tags": ["a", "b"],
        "id": "00000000-0000-0000-0000-000000000001",
        "wait": "1:00:05",
        "x": "Infinity",
        "by_id": {"1": "one"},
    }
    json.dumps(shown, allow_nan=False)  # JSON-able


def test_display_never_decrypts(settings):
    text = codec.encode({"password": "pw"})
    settings.DURABLE = {"ENCRYPTION_KEY": KEY_A}  # a key that cannot open the token
    assert codec.decode_for_display(text) == {"password": "[REDACTED]"}


def test_error_path_is_redacted():
    with pytest.raises(PayloadError) as err:
        codec.encode({"sk-live-abcdef123": [object()]})
    assert "abcdef123" not in str(err.value)


# --- encryption keys -------------------------------------------------------------------


def token_of(text: str) -> str:
    tagged = json.loads(text)
    assert tagged["$t"] == "secret"
    return tagged["v"]


def test_default_key_is_derived_from_secret_key(settings):
    settings.DURABLE = {}
    token = token_of(codec.encode("sk-live-abcdef123"))
    assert Fernet(derive_key(settings.SECRET_KEY)).decrypt(token.encode()) == b"sk-live-abcdef123"


def test_changing_encryption_key_changes_ciphertext():
    with override_settings(DURABLE={"ENCRYPTION_KEY": KEY_A}):
        text = codec.encode({"token": "abc"})
        token = token_of(json.dumps(json.loads(text)["token"]))
        assert Fernet(KEY_A).decrypt(token.encode()) == b"abc"
        assert codec.decode(text) == {"token": "abc"}
    with override_settings(DURABLE={"ENCRYPTION_KEY": KEY_B}):
        token_b = token_of(json.dumps(json.loads(codec.encode({"token": "abc"}))["token"]))
        assert Fernet(KEY_B).decrypt(token_b.encode()) == b"abc"
        with pytest.raises(DurableConfigurationError, match="cannot decrypt"):
            codec.decode(text)


def test_key_rotation_decrypts_old_tokens():
    with override_settings(DURABLE={"ENCRYPTION_KEY": KEY_A}):
        old = encrypt("old secret")
    with override_settings(DURABLE={"ENCRYPTION_KEY": f"{KEY_B}, {KEY_A}"}):
        assert decrypt(old) == "old secret"
        new = encrypt("new secret")
        assert Fernet(KEY_B).decrypt(new.encode()) == b"new secret"
    with (
        override_settings(DURABLE={"ENCRYPTION_KEY": KEY_A}),
        pytest.raises(DurableConfigurationError),
    ):
        decrypt(new)


def test_invalid_encryption_key(settings):
    settings.DURABLE = {"ENCRYPTION_KEY": "not-a-key"}
    with pytest.raises(DurableConfigurationError, match="key #1 is not a valid Fernet key"):
        encrypt("x")


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "b": [1.5, null, "x"]}',
        b'{"a": 1}',
        '{"a": 1}'.encode("utf-16"),
        "\ufeff{}",
        b"\xef\xbb\xbf{}",
        "not json",
        '[{"__t": "bytes", "v": "AAE="}, {"__t": "nope"}]',
    ],
)
def test_decoding_with_one_decoder_answers_as_json_loads(text):
    """decoder.decode and decode_for_display reuse one JSONDecoder each instead of
    json.loads building one a call: the same values, and the same errors."""
    from durable.values import decoder

    for hook, ours in (
        (decoder._hook, decoder.decode),
        (decoder._display_hook, decoder.decode_for_display),
    ):
        try:
            expected: object = json.loads(text, object_hook=hook)
        except Exception as exc:  # noqa: BLE001 - the error itself is compared
            expected = (type(exc), str(exc))
        try:
            got: object = ours(text)
        except Exception as exc:  # noqa: BLE001
            got = (type(exc), str(exc))
        assert got == expected
