package auth

// Revocation: a reload can take a connected client's identity away.
// A client that logged in with a password holds on to the users file
// line it logged in with; when the rules in force no longer have that
// line (the user was removed, or given a new password), its Access
// answers no to everything, and Revoked says why, so that the broker
// closes the connection. Anonymous clients and certificate identities
// are not judged by the users file: a reload does not revoke them (a
// certificate is withdrawn by its CA, at the next handshake).

// Why a client's identity was revoked.
const (
	RevokedRemoved  = "user removed from the users file"
	RevokedPassword = "password changed"
)

// Revoked reports whether the client's identity no longer holds under
// the rules in force, and why.
func (x *Access) Revoked() (string, bool) {
	why := x.revokedBy(x.a.cur.Load())
	return why, why != ""
}

// revokedBy is why set revokes the client's identity, "" when it does not.
func (x *Access) revokedBy(set *ruleset) string {
	if x.hash == "" || set.users == nil {
		return ""
	}
	u, ok := set.users.m[x.user]
	switch {
	case !ok:
		return RevokedRemoved
	case u.raw != x.hash:
		return RevokedPassword
	}
	return ""
}
