"""GET /v1/models through the gateway: the union of what the fleet's replicas serve, each id
once, with the max_model_len the replicas report (an adapter's from its base model)."""

from __future__ import annotations

from dataclasses import replace

import httpx
import openai

from gateway.config import ReplicaConfig
from gateway.process import running_gateway
from gateway.replicas.model_cards import model_cards
from simulator import SimConfig, SimFleet
from tests.gateway.conftest import LORA, MODEL, SIM, eventually, gateway_config, set_faults

OTHER = SimConfig(
    model="other-7b", lora_adapters=("other-lora",), max_model_len=4096, kv_events=False
)
SHORT = replace(SIM, max_model_len=2048)
EMBED = SimConfig(model="sim-embed", runner="pooling", kv_events=False, max_model_len=512)


async def test_models_are_the_union_of_the_fleets_models_and_adapters() -> None:
    async with (
        SimFleet(SIM, replicas=2, host="127.0.0.1", base_port=0) as base,
        SimFleet(SHORT, replicas=1, host="127.0.0.1", base_port=0) as short,
        SimFleet(OTHER, replicas=1, host="127.0.0.1", base_port=0) as other,
        SimFleet(EMBED, replicas=1, host="127.0.0.1", base_port=0) as embed,
    ):
        fleets = {"base": base, "short": short, "other": other, "embed": embed}
        replicas = tuple(
            ReplicaConfig(url=r.url, name=f"{kind}-{r.index}")
            for kind, fleet in fleets.items()
            for r in fleet.replicas
        )
        cfg = gateway_config(base, replicas=replicas)
        async with running_gateway(cfg) as gw:
            pool = gw.runtime.pool
            await eventually(lambda: all(r.model_cards for r in pool), what="every card")
            async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x") as client:
                page = await client.models.list()
            cards = {m.id: m.model_dump() for m in page.data}
            assert sorted(cards) == sorted([MODEL, LORA, "other-7b", "other-lora", "sim-embed"])
            assert len(page.data) == len(cards)  # deduplicated by id
            # Two replicas report 8192 for MODEL and one 2048: the union says what all take.
            lengths = {mid: card["max_model_len"] for mid, card in cards.items()}
            assert lengths == {MODEL: 2048, LORA: 2048, "other-7b": 4096, "other-lora": 4096,
                               "sim-embed": 512}  # fmt: skip
            assert cards[LORA]["parent"] == MODEL and cards["other-lora"]["parent"] == "other-7b"
            # gRPC's ListModels lists the pool's union: the same cards, lengths included.
            union = {c["id"]: c.get("max_model_len") for c in pool.model_cards()}
            assert union == lengths
            # A replica that is down takes its models out of the list until it is back.
            await set_faults(other.replicas[0].url, unhealthy=True)
            await eventually(lambda: not pool["other-0"].healthy, what="other-0 down")
            async with httpx.AsyncClient(base_url=gw.url) as c:
                ids = {m["id"] for m in (await c.get("/v1/models")).json()["data"]}
            assert ids == {MODEL, LORA, "sim-embed"}


def test_model_cards_union_rules() -> None:
    base = {"id": "m", "parent": None, "max_model_len": 100}
    lora = {"id": "a", "parent": "m", "max_model_len": None}
    orphan = {"id": "b", "parent": "gone", "max_model_len": None}
    out = model_cards(
        [
            (True, (base, lora)),
            (True, ({**base, "max_model_len": 50}, orphan)),
            (False, ({**base, "max_model_len": 10},)),  # down: neither listed nor counted
        ]
    )
    assert out == [{**base, "max_model_len": 50}, {**lora, "max_model_len": 50}, orphan]
    assert base["max_model_len"] == 100  # the replicas' own cards are not changed
