"""One typed configuration in sections: defaults, then a TOML file, then ``DUPLEX_*`` env,
then CLI flags.

TOML layout (docs/operations.md, "Configuration", lists every key)::

    [server]
    host = "127.0.0.1"
    port = 8000

    [engine]
    model = "loopback"

    [session]
    overlap_policy = "barge_in_on_speech"

Environment: ``DUPLEX_ENGINE__MODEL=tiny`` sets ``engine.model``. The flat names of the
time before sections still work as aliases: ``[server] model = "tiny"``,
``DUPLEX_MODEL=tiny`` and ``server.model`` (an override) set ``engine.model`` too.
"""

from duplex.sessions import SessionConfig

from ._declare import ENV_PREFIX, Declared, Setting, setting
from ._doc import DOC_BEGIN, DOC_END, add_flags, doc_table, flag_overrides, with_table
from ._load import ALIASES, DECLARED, SECTIONS, api_keys_of, load_config
from ._sections import (
    CLIENT_SECRET_MAX_TTL_S,
    CLIENT_SECRET_MIN_TTL_S,
    MAX_CHAT_WAIT_QUEUE,
    MAX_CONNECTION_WORKERS,
    MAX_POLICY_BATCH,
    MAX_SESSION_SHARDS,
    AccessConfig,
    AgentConfig,
    Config,
    EngineConfig,
    MediaConfig,
    PolicyConfig,
    ServerConfig,
    SpeechConfig,
    is_loopback,
    refuse,
)

__all__ = [
    "ALIASES",
    "CLIENT_SECRET_MAX_TTL_S",
    "CLIENT_SECRET_MIN_TTL_S",
    "DECLARED",
    "DOC_BEGIN",
    "DOC_END",
    "ENV_PREFIX",
    "MAX_CHAT_WAIT_QUEUE",
    "MAX_CONNECTION_WORKERS",
    "MAX_POLICY_BATCH",
    "MAX_SESSION_SHARDS",
    "SECTIONS",
    "AccessConfig",
    "AgentConfig",
    "Config",
    "Declared",
    "EngineConfig",
    "MediaConfig",
    "PolicyConfig",
    "ServerConfig",
    "SessionConfig",
    "Setting",
    "SpeechConfig",
    "add_flags",
    "api_keys_of",
    "doc_table",
    "flag_overrides",
    "is_loopback",
    "load_config",
    "refuse",
    "setting",
    "with_table",
]
