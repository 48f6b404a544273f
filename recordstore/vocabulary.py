"""The lexicon NSIDs turnd reads and writes, named once.

Everything that spells a ``network.sharedcomputer.chat.*`` name imports it from here;
the names match the JSON documents in :mod:`lexicons` (``tests/test_vocabulary.py``
checks each one against them).
"""

from __future__ import annotations

__all__ = [
    "NSID",
    "DEFS",
    "CONVERSATION",
    "SETTINGS",
    "SETTINGS_SPACE",
    "MESSAGE",
    "INFO",
    "PREFERENCES",
    "CONVERSATION_REF",
    "SUMMARY",
    "APPROVAL",
    "COLLECTIONS",
    "PLAIN_CONTENT",
    "ENCRYPTED_CONTENT",
    "TEXT_PART",
    "REASONING_PART",
    "TOOL_CALL_PART",
    "TOOL_RESULT_PART",
    "SOURCE_PART",
    "IMAGE_PART",
    "FILE_PART",
]

NSID = "network.sharedcomputer.chat"
DEFS = f"{NSID}.defs"

# Space types (lexicon tokens: no record is validated against them).
CONVERSATION = f"{NSID}.conversation"
SETTINGS = f"{NSID}.settings"
SETTINGS_SPACE = "self"  # the settings space's key

# Record collections.
MESSAGE = f"{NSID}.message"
INFO = f"{NSID}.info"
PREFERENCES = f"{NSID}.preferences"
CONVERSATION_REF = f"{NSID}.conversationRef"
SUMMARY = f"{NSID}.summary"  # in a conversation, at the key of the last message it covers
APPROVAL = f"{NSID}.approval"  # in a conversation, at <replyKey>.a<index>: a tool call's yes/no
COLLECTIONS = (APPROVAL, CONVERSATION_REF, INFO, MESSAGE, PREFERENCES, SUMMARY)

# Content and parts (defs.json).
PLAIN_CONTENT = f"{DEFS}#plainContent"
ENCRYPTED_CONTENT = f"{DEFS}#encryptedContent"
TEXT_PART = f"{DEFS}#textPart"
REASONING_PART = f"{DEFS}#reasoningPart"
TOOL_CALL_PART = f"{DEFS}#toolCallPart"
TOOL_RESULT_PART = f"{DEFS}#toolResultPart"
SOURCE_PART = f"{DEFS}#sourcePart"
IMAGE_PART = f"{DEFS}#imagePart"
FILE_PART = f"{DEFS}#filePart"
