"""Who may do what: roles, the permissions each grants, and the team scope of members. Pure data and functions.

Every API operation names one permission (HTTP routes in their `opt`, gRPC methods in their table); a principal
holds it when its role grants it. Members are further scoped to their teams: they submit, cancel and read only
their own teams' jobs. The authorization matrix test walks every endpoint with every role against `GRANTS`.
"""

from enum import StrEnum

import msgspec


class Role(StrEnum):
    ADMIN = "admin"
    """Everything, including tokens, teams and pools."""
    OPERATOR = "operator"
    """Reads everything; cordons and releases nodes and GPUs, injects simulated faults; reads the audit trail."""
    MEMBER = "member"
    """Reads the fleet and teams; submits, cancels and reads the jobs of its own teams."""
    VIEWER = "viewer"
    """Reads everything, changes nothing."""


class Permission(StrEnum):
    READ = "read"
    """Fleet, nodes, GPUs, teams, pools, organisations, metric history, the live stream, `GET /v1/me`."""
    JOBS_READ = "jobs:read"
    JOBS_WRITE = "jobs:write"
    NODES_OPERATE = "nodes:operate"
    QUOTA_WRITE = "quota:write"
    TOKENS_MANAGE = "tokens:manage"
    AUDIT_READ = "audit:read"


GRANTS: dict[Role, frozenset[Permission]] = {
    Role.ADMIN: frozenset(Permission),
    Role.OPERATOR: frozenset({Permission.READ, Permission.JOBS_READ, Permission.NODES_OPERATE, Permission.AUDIT_READ}),
    Role.MEMBER: frozenset({Permission.READ, Permission.JOBS_READ, Permission.JOBS_WRITE}),
    Role.VIEWER: frozenset({Permission.READ, Permission.JOBS_READ}),
}


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """Who is calling: the token's id and name, its role and (members) its teams."""

    id: str
    name: str
    role: Role
    teams: tuple[str, ...] = ()

    def may(self, permission: Permission) -> bool:
        return permission in GRANTS[self.role]

    @property
    def team_scope(self) -> frozenset[str] | None:
        """The teams whose jobs this principal sees and acts on; None: every team."""
        return frozenset(self.teams) if self.role == Role.MEMBER else None

    def may_touch_team(self, team: str) -> bool:
        scope = self.team_scope
        return scope is None or team in scope


def denial(principal: Principal, permission: Permission) -> str | None:
    """Why `principal` may not use `permission`; None when it may."""
    if principal.may(permission):
        return None
    allowed = sorted(role.value for role, grants in GRANTS.items() if permission in grants)
    return f"role {principal.role.value} may not {permission.value}; it takes one of: {', '.join(allowed)}"


def team_denial(principal: Principal, team: str) -> str | None:
    """Why `principal` may not act on team `team`'s jobs; None when it may."""
    if principal.may_touch_team(team):
        return None
    return f"{principal.name} is a member of {', '.join(principal.teams) or 'no team'}, not of {team!r}"
