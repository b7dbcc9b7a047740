from gateway.keys import KeyPolicy, cron_key, session_key
from gateway.types import ChatType, InboundMessage


def msg(chat_type, chat="100", user="7", thread=None, platform="telegram"):
    return InboundMessage(platform=platform, chat_type=chat_type, chat_id=chat, user_id=user, text="hi", thread_id=thread)


def test_documented_shapes():
    p = KeyPolicy()
    assert session_key(msg(ChatType.DM), p) == "agent:main:telegram:dm:100"
    assert session_key(msg(ChatType.GROUP), p) == "agent:main:telegram:group:100:7"
    assert session_key(msg(ChatType.THREAD, thread="55"), p) == "agent:main:telegram:group:100:55"
    assert session_key(msg(ChatType.CHANNEL, platform="slack", chat="C1", user="U9"), p) == "agent:main:slack:channel:C1:U9"
    assert cron_key("main", "briefing") == "agent:main:cron:briefing"


def test_shared_rooms_and_per_user_threads():
    shared = KeyPolicy(group_sessions_per_user=False)
    assert session_key(msg(ChatType.GROUP), shared) == "agent:main:telegram:group:100"
    assert session_key(msg(ChatType.GROUP, user=None), KeyPolicy()) == "agent:main:telegram:group:100"
    per_user = KeyPolicy(thread_sessions_per_user=True)
    assert session_key(msg(ChatType.THREAD, thread="55"), per_user) == "agent:main:telegram:group:100:55:7"


def test_agents_never_share_and_ids_cannot_forge_keys():
    assert session_key(msg(ChatType.DM), KeyPolicy(agent="main")) != session_key(msg(ChatType.DM), KeyPolicy(agent="ops"))
    forged = session_key(msg(ChatType.GROUP, chat="100:7", user=None), KeyPolicy())
    assert forged != session_key(msg(ChatType.GROUP), KeyPolicy())
