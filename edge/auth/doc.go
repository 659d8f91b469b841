// Package auth holds who may use a Peat node and what they may do: users
// with hashed passwords, ordered topic ACLs, and HTTP API tokens. It is
// plain Go; edge adapts it to the MQTT front-end's Auth interface.
//
// # Users
//
// A users file has one "name:hash" line per user, Mosquitto's format.
// `peat passwd` writes argon2id hashes (PHC strings); bcrypt hashes and
// the $6$ (SHA-512) and $7$ (PBKDF2-SHA512) lines of mosquitto_passwd are
// accepted too, so a Mosquitto site brings its file along. A plain-text
// password is not a hash: the file is refused. Comparisons are constant
// time. A reconnect storm is bounded twice: at most MaxConcurrentHashes
// hashes run at once, and a cache keyed by an HMAC of user, stored hash
// and password (never the password) answers a device that reconnects with
// its right password without hashing again. Timing does not tell which
// names exist: a wrong password is hashed every time (the cache holds
// right ones only), and an unknown user costs a hash of the kind and cost
// most of the file's users have (dummy.go).
//
// # ACLs
//
// An ACL file is an ordered list of rules; the first rule that applies to
// a question decides, and no rule means no:
//
//	# <allow|deny> <read|write|readwrite> <*|user:NAME|client:ID> <filter>
//	allow readwrite user:admin  #
//	deny  read      *           test/nosubscribe
//	allow readwrite *           devices/%c/#
//	allow read      *           sensors/#
//
// %u and %c stand for the user name and client id, and only as a whole
// level: dev-%c is the literal level "dev-%c". A name that is empty or
// holds +, # or / never stands in (a client id "#" widened Mosquitto's
// pattern ACLs, CVE-2017-7650): an allow rule that needs it does not apply,
// and a deny rule gets + in its place, denying at least as much. Topics
// are matched by logstore.MatchFilter, the matcher routing uses, so # does
// not match $ topics ($offsets/... is decided by group rules). Unlike mochi's
// ledger, rules keep their order, the default is deny, and a filter a/b
// does not match a/b/c.
//
// Consumer groups and client ids are objects of the same file, in the
// same order (tenancy.go):
//
//	# <allow|deny> <read|write|readwrite> <who> group:<pattern>
//	# <allow|deny> connect <who> clientid:<pattern>
//	allow readwrite *          group:%u.*
//	allow read      user:ops   group:*
//	allow connect   user:admin clientid:*
//	allow connect   *          clientid:%u-*
//	allow read      user:hq    clientid:*
//
// In a pattern, * is any text and %u and %c stand anywhere (a
// substituted name is matched literally: a user "a*" is no wildcard); an
// allow that needs a name the client lacks does not apply, a deny matches
// any text there. Group rules answer MayGroup: read is a group's
// committed offsets, write consuming and committing; with an ACL and no
// match, no. Client-id rules answer MayUseClientID only when the file has
// some (with none, any id is allowed: %c then proves nothing); the first
// that applies to the client and matches its id decides, no match is no.
// Read rules on client ids answer MayReadClientID: whose client ids a
// $replay or $group subscriber that asks is shown as each record's
// publisher (a Peat source mirroring this node asks). Without an ACL
// every client may; with one, the first read rule that applies to the
// client and matches the publisher's id decides, no match is no, so an
// ACL written before these rules shows nobody's. They do not count as
// client-id rules for MayUseClientID. A line whose object starts with
// group: or clientid: is one of these, never a topic rule. Identity names the client for session ownership:
// "user:<name>" (by password or certificate alike) or "anonymous".
//
// A subscription is granted when some topic matching it may be read
// (maySubscribe); every record delivered is then checked by topic, unless
// an allow rule covers the whole filter before any deny touches it
// (readsAll), which is answered once per filter. covers and overlaps,
// relations between two filters, are decided with witness topics handed
// to MatchFilter, so they follow its rules, $ topics included; a fuzz test
// holds them to it.
//
// # Tokens
//
// A tokens file has one "name:role:sha256" line per HTTP API token, the
// hex SHA-256 of the token, so the file holds no secret: `peat token`
// makes a random 32-byte token, writes its line and prints the token
// once. Check hashes what is presented and compares it with every line in
// constant time. Roles are read (GET, HEAD) and admin (everything).
//
// # Reload
//
// Auth.Reload reads both files again (Tokens.Reload its own); only when
// both are good do they replace the rules, for connected clients too (each Access rebuilds its
// rules and empties its caches when it sees a new generation).
//
// A client that logged in with a password keeps the users file line it
// logged in with (revoke.go). Under rules whose users file no longer has
// that line (the user removed, or given a new password) its Access
// answers no to every question, and Revoked says why, for the broker to
// close the connection. Anonymous clients and certificate identities
// are not revoked by a reload.
package auth
