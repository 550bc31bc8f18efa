"""Command-line options for key/value formats and the Schema Registry, shared by ``run``, ``get`` and ``export``.

Options::

    --key-format FMT / --value-format FMT    bytes | str | json | avro  (get/export also: auto)
    --schema-registry-url URL                env SCHEMA_REGISTRY_URL too
    --schema-registry-basic-auth USER:PASS   confluent-kafka's basic.auth.user.info
    -S KEY=VALUE                             any other registry client setting (ssl.ca.location, ...)

The registry client is built only when a format is ``avro``.
"""

from __future__ import annotations

from typing import Any, Callable

import click

from materializer.cli.options import key_value_items

__all__ = ["format_options", "registry_options", "registry_config", "registry_client"]


def format_options(*, with_auto: bool, default: str | None,
                   default_help: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--key-format`` and ``--value-format`` (``auto`` too when ``with_auto``), both defaulting to
    ``default``; None leaves them None when not given (the command decides, ``default_help`` says how)."""
    choices = (("auto",) if with_auto else ()) + ("bytes", "str", "json", "avro")

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        func = click.option("--value-format", type=click.Choice(choices), default=default,
                            show_default=default is not None,
                            help="How values were serialized: bytes, str (UTF-8), json, avro (Confluent wire "
                                 "format, schemas from --schema-registry-url)"
                                 + ("; auto: UTF-8 text else base64." if with_auto else ".") + default_help)(func)
        func = click.option("--key-format", type=click.Choice(choices), default=default,
                            show_default=default is not None,
                            help="How keys were serialized (same formats as --value-format)." + default_help)(func)
        return func

    return decorate


def registry_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--schema-registry-url``, ``--schema-registry-basic-auth`` and ``-S`` (registry client settings)."""
    func = click.option("-S", "registry_items", multiple=True, metavar="KEY=VALUE",
                        help="Schema Registry client setting as confluent-kafka names it (e.g. "
                             "-S ssl.ca.location=ca.pem); repeatable.")(func)
    func = click.option("--schema-registry-basic-auth", "registry_basic_auth", metavar="USER:PASSWORD",
                        help="HTTP basic auth for the Schema Registry (basic.auth.user.info).")(func)
    func = click.option("--schema-registry-url", "registry_url", envvar=["MATERIALIZER_SCHEMA_REGISTRY_URL",
                                                                          "SCHEMA_REGISTRY_URL"],
                        show_envvar=True, metavar="URL",
                        help="Schema Registry for avro keys/values, e.g. http://127.0.0.1:8081 or "
                             "Apicurio's http://HOST:PORT/apis/ccompat/v7.")(func)
    return func


def registry_config(basic_auth: str | None, items: tuple[str, ...]) -> dict[str, str]:
    """Client settings from ``--schema-registry-basic-auth`` and ``-S KEY=VALUE`` items.

    Raises:
        ValueError: an item without ``=``, or basic auth without ``:``.
    """
    config: dict[str, str] = {}
    if basic_auth:
        if ":" not in basic_auth:
            raise ValueError("--schema-registry-basic-auth must be USER:PASSWORD")
        config["basic.auth.credentials.source"] = "USER_INFO"
        config["basic.auth.user.info"] = basic_auth
    config.update(key_value_items(items, "-S"))
    return config


def registry_client(url: str | None, basic_auth: str | None, items: tuple[str, ...], *formats: str) -> Any:
    """A ``SchemaRegistryClient`` when one of ``formats`` is ``avro``, else None.

    Raises:
        ValueError: ``avro`` without ``--schema-registry-url``; bad settings.
        SchemaRegistryError: confluent-kafka's registry extras are missing.
    """
    if "avro" not in formats:
        return None
    if not url:
        raise ValueError("the avro format needs --schema-registry-url (or SCHEMA_REGISTRY_URL)")
    from materializer.adapters.avro_serde import schema_registry_client

    return schema_registry_client(url, registry_config(basic_auth, items))
