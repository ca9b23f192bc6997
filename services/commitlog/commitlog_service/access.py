"""The Access servicer (access.proto): users, rules and SDK keys, a thin adapter over mqstore.auth.admin.

Served on the CommitLog server. Thread-safe: holds the admin object (thread-safe) only.
"""

from __future__ import annotations

import grpc
from mqstore import access
from mqstore.auth.admin import AccessAdmin
from mqstore.access import Rule, SdkKey, User
from mqstore.errors import InvalidArgument
from mqstore_rpc.gen.mqstore.v1 import access_pb2 as pb, access_pb2_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Access"].full_name
_KIND_TO_PB = {access.NORMAL: pb.USER_KIND_NORMAL, access.SUPER: pb.USER_KIND_SUPER}
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}
_RESOURCE_TO_PB = {access.TOPIC: pb.RESOURCE_KIND_TOPIC, access.GROUP: pb.RESOURCE_KIND_GROUP,
                   access.CLUSTER: pb.RESOURCE_KIND_CLUSTER}
_RESOURCE_FROM_PB = {v: k for k, v in _RESOURCE_TO_PB.items()}
_ACTION_TO_PB = {access.PUB: pb.ACTION_PUB, access.SUB: pb.ACTION_SUB, access.ADMIN: pb.ACTION_ADMIN}
_ACTION_FROM_PB = {v: k for k, v in _ACTION_TO_PB.items()}
_DECISION_TO_PB = {access.ALLOW: pb.RULE_DECISION_ALLOW, access.DENY: pb.RULE_DECISION_DENY}
_DECISION_FROM_PB = {v: k for k, v in _DECISION_TO_PB.items()}


def _enum(table: dict, value: int, field: str):
    try:
        return table[value]
    except KeyError:
        raise InvalidArgument(f"{field}: {value} is not a known value ({', '.join(str(k) for k in table)})") from None


def _user(u: User) -> pb.User:
    return pb.User(name=u.name, kind=_KIND_TO_PB[u.kind], created_ms=u.created_ms, updated_ms=u.updated_ms)


def _rule(r: Rule) -> pb.AccessRule:
    return pb.AccessRule(id=r.rule_id, user=r.user, resource_kind=_RESOURCE_TO_PB[r.kind], pattern=r.pattern,
                         actions=[_ACTION_TO_PB[a] for a in sorted(r.actions)], decision=_DECISION_TO_PB[r.decision])


def _sdk_key(k: SdkKey) -> pb.SdkKey:
    return pb.SdkKey(access_key=k.access_key, user=k.user, created_ms=k.created_ms)  # never the secret


class AccessServicer(access_pb2_grpc.AccessServicer):
    def __init__(self, admin: AccessAdmin):
        self._admin = admin

    def CreateUser(self, request, context):
        created = self._admin.create_user(request.name, _enum(_KIND_FROM_PB, request.kind, "kind"), request.secret)
        return pb.UserSecret(user=_user(created.user), generated_secret=created.secret)

    def UpdateUser(self, request, context):
        kind = _enum(_KIND_FROM_PB, request.kind, "kind") if request.HasField("kind") else ""
        generated = self._admin.update_user(request.name, kind=kind, secret=request.secret,
                                            new_secret=request.new_secret)
        user = next(u for u in self._admin.users() if u.name == request.name)
        return pb.UserSecret(user=_user(user), generated_secret=generated)

    def DeleteUser(self, request, context):
        self._admin.delete_user(request.name)
        return pb.DeleteUserResponse()

    def ListUsers(self, request, context):
        return pb.ListUsersResponse(users=[_user(u) for u in self._admin.users()])

    def AddRule(self, request, context):
        actions = frozenset(_enum(_ACTION_FROM_PB, a, "actions") for a in request.actions)
        if not actions:
            raise InvalidArgument("actions: one or more of ACTION_PUB, ACTION_SUB, ACTION_ADMIN")
        rule = self._admin.add_rule(request.user, _enum(_RESOURCE_FROM_PB, request.resource_kind, "resource_kind"),
                                    request.pattern, actions, _enum(_DECISION_FROM_PB, request.decision, "decision"))
        return _rule(rule)

    def DeleteRule(self, request, context):
        self._admin.delete_rule(request.id)
        return pb.DeleteRuleResponse()

    def ListRules(self, request, context):
        return pb.ListRulesResponse(rules=[_rule(r) for r in self._admin.rules(request.user)])

    def CreateSdkKey(self, request, context):
        created = self._admin.create_sdk_key(request.user)
        return pb.SdkKeySecret(key=_sdk_key(created.key), secret_key=created.secret_key)

    def ListSdkKeys(self, request, context):
        return pb.ListSdkKeysResponse(keys=[_sdk_key(k) for k in self._admin.sdk_keys(request.user)])

    def RevokeSdkKey(self, request, context):
        self._admin.revoke_sdk_key(request.access_key)
        return pb.RevokeSdkKeyResponse()


def add_to_server(servicer: AccessServicer, server: grpc.Server) -> None:
    access_pb2_grpc.add_AccessServicer_to_server(servicer, server)
