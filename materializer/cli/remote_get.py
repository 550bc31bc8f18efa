"""``materializer get --group-id G --bootstrap-servers B --topic T KEY``: a key read from the consumer
group's members over HTTP (issue 39), with no local data dir.

The group coordinator names the member that holds KEY's partition (DescribeConsumerGroups:
:func:`materializer.group.routing.owner_of`) and its query server's URL, carried in its
``client.id`` (:mod:`materializer.adapters.partition_owner`); that member is asked
``GET /v1/topics/T/keys/KEY``. When the owner serves no queries or no member holds the partition
(a rebalance), any member that serves queries is asked instead: it forwards the key to the owner
(:mod:`materializer.serve.forwarding`), whose answer comes back, so a partitioner guessed wrong
here still reaches the right member. Requests go through
:func:`~materializer.adapters.member_http.member_opener` (no proxy, no redirect followed, so the
token goes only to a member's own URL); with ``--serve-ca-file`` a plain ``http://`` member URL is
not asked. "Not found" is a 404 whose body says ``"absent": true``, nothing else (its ``deleted``,
when the owner's local log still shows the key's tombstone, is passed on).
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from materializer.adapters.group_members import GroupMembersClient
from materializer.adapters.member_http import member_opener
from materializer.adapters.serdes import decode_for_display
from materializer.cli.conventions import CommandError

__all__ = ["echo_value", "remote_get"]

#: Seconds a member may take to answer.
_TIMEOUT_S = 10.0


def remote_get(bootstrap_servers: str, group_id: str, topic: str, key: bytes, *, partitioner: str,
               config: Mapping[str, str], fmt: str | None, token_file: Path | None,
               ca_file: Path | None) -> tuple[dict[str, Any], str | bytes | None]:
    """The answer of the member that holds ``key`` and the value as ``get`` prints it (``fmt``: a
    display format, None: by the topic's value format); when the topic holds no live value, the
    owner's 404 body (``deleted``: where its local log shows the key's tombstone, when it does) and None.

    Raises:
        CommandError: no member of the group serves queries, or the members asked cannot answer
            now (the error names the member and says why; a 503 names its Retry-After).
        BrokerUnreachableError, KafkaSourceError: the group coordinator did not answer.
    """
    from materializer.group.routing import partition_for_key

    members = GroupMembersClient(bootstrap_servers, config)
    partition = partition_for_key(key, members.partition_count(topic), partitioner=partitioner)
    owners = members.partition_owners(group_id, topic)
    urls = [o.serving_url for o in owners.values() if o.serving_url is not None]
    owner = owners.get(partition)
    first = owner.serving_url if owner is not None and owner.serving_url is not None else None
    candidates = list(dict.fromkeys(([first] if first else []) + sorted(urls)))
    if not candidates:
        why = f"no member holds partition {partition}" if owner is None else "its owner runs without --serve"
        raise CommandError(f"no member of group {group_id!r} serves queries of topic {topic!r} now ({why})")
    token = token_file.read_text(encoding="utf-8").strip() if token_file is not None else None
    opener = member_opener(ssl.create_default_context(cafile=None if ca_file is None else str(ca_file)))
    path = f"/v1/topics/{quote(topic, safe='')}/keys/{quote(base64.b64encode(key).decode(), safe='')}?key_encoding=base64"
    failures = []
    for url in candidates[:2]:  # the owner, then one member that forwards to it
        if ca_file is not None and not url.startswith("https://"):  # the members run TLS: no token in clear
            failures.append(f"{url} is not https:// though --serve-ca-file is given: not asked")
            continue
        request = urllib.request.Request(url + path, headers={"Accept": "application/json"})
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with opener.open(request, timeout=_TIMEOUT_S) as response:  # no proxy, no redirect followed
                answer = json.loads(response.read())
        except urllib.error.HTTPError as error:
            with error:
                body = _json_or_text(error.read())
            if error.code == 404 and body.get("absent") is True:
                return body, None
            retry = f" (Retry-After: {error.headers.get('Retry-After')} s)" if error.code == 503 else ""
            failures.append(f"{url} answered {error.code}: {body.get('error')}{retry}")
            continue
        except (OSError, ValueError) as exc:
            failures.append(f"{url} did not answer ({exc})")
            continue
        return answer, _shown(answer, fmt)
    raise CommandError(f"key of partition {partition} of topic {topic!r} in group {group_id!r}: " + "; ".join(failures))


def _json_or_text(raw: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {"error": raw[:200].decode("utf-8", "replace")}
    return parsed if isinstance(parsed, dict) else {"error": str(parsed)}


def _shown(answer: Mapping[str, Any], fmt: str | None) -> str | bytes:
    """The value as the local ``get`` prints it: the bytes for a ``bytes`` topic (base64 in the
    answer), the text for ``str``, pretty JSON for ``json`` and ``avro``."""
    value, value_format = answer["value"], answer.get("value_format", "bytes")
    if value_format in ("json", "avro") and fmt in (None, "json"):
        return json.dumps(value, indent=2, ensure_ascii=False)
    raw = (base64.b64decode(value) if value_format == "bytes" else
           value.encode("utf-8") if value_format == "str" else json.dumps(value, ensure_ascii=False).encode())
    return decode_for_display(raw, fmt or ("str" if value_format == "str" else "auto"))


def echo_value(shown: str | bytes) -> None:
    """Print a value as ``get`` does (bytes raw, text with a newline)."""
    if isinstance(shown, bytes):
        click.echo(shown, nl=False)
    else:
        click.echo(shown)


