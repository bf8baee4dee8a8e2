"""The transactional ids of a group's instances: one prefix for all, which is what a
least-privilege ACL grants (docs/runtime.md, "Kafka ACLs")."""

from __future__ import annotations

import uuid

from service.settings import GroupSettings, Settings


def transactional_id_prefix(group: GroupSettings) -> str:
    """What every transactional id of the group's instances starts with: the one prefix a
    least-privilege ACL grants (docs/runtime.md, "Kafka ACLs")."""
    return f"{group.group_id}-"


def partition_transactional_id(group: GroupSettings, partition: int) -> str:
    """The transactional id of a partition's own stream (``transaction_streams=partition``)."""
    return f"{transactional_id_prefix(group)}{partition}"


def instance_transactional_id(settings: Settings) -> str:
    """The instance's transactional id: stable across restarts of a static member (its new
    incarnation fences the old one at once), unique per process otherwise."""
    group = settings.group
    suffix = group.instance_id if group.instance_id is not None else uuid.uuid4().hex[:12]
    return f"{transactional_id_prefix(group)}{suffix}"
