package auth

import (
	"fmt"
	"strings"
)

// Rules about state a client may own, beside the topic rules: consumer
// groups and client ids. They share the ACL file and its order:
//
//	<allow|deny> <read|write|readwrite> <who> group:<pattern>
//	<allow|deny> connect                <who> clientid:<pattern>
//	<allow|deny> read                   <who> clientid:<pattern>
//
// A connect rule is about the client's own id; a read rule about other
// clients' ids: whose a $replay or $group subscriber that asks is shown
// as each record's publisher (MayReadClientID).
//
// A pattern is a name in which * stands for any run of characters and
// %u (the user name) and %c (the client id, group rules only) stand for
// themselves anywhere: group:%u.* is every group whose name starts with
// the user's name and a dot. A substituted name is matched literally, so
// a user called "a*" is no wildcard. An allow rule that needs a name the
// client does not have (%u for an anonymous client) does not apply; a
// deny rule matches any text there, denying at least as much.

// Object prefixes of group and client-id rules.
const (
	groupObject    = "group:"
	clientIDObject = "clientid:"
)

// objRule is a group or client-id rule.
type objRule struct {
	allow       bool
	read, write bool
	user        string // who: user:<name>
	client      string // who: client:<id>
	pattern     string
}

// parseObjectRule parses a group or client-id rule; ok is false for a
// line that is neither (a topic rule, or a bad line parseRule reports).
func parseObjectRule(line string) (ru objRule, clientID, ok bool, err error) {
	fields := strings.Fields(line)
	if len(fields) < 4 {
		return ru, false, false, nil
	}
	object := strings.TrimSpace(strings.Join(fields[3:], " "))
	isGroup := strings.HasPrefix(object, groupObject)
	clientID = strings.HasPrefix(object, clientIDObject)
	if !isGroup && !clientID && fields[1] != "connect" {
		return ru, false, false, nil
	}
	switch fields[0] {
	case "allow":
		ru.allow = true
	case "deny":
	default:
		return ru, clientID, true, fmt.Errorf("%q: want allow or deny", fields[0])
	}
	switch access := fields[1]; {
	case access == "connect" && clientID:
	case access == "connect":
		return ru, clientID, true, fmt.Errorf("connect rules name client ids: want clientid:<pattern>, got %q", object)
	case access == "read" && clientID:
		ru.read = true
	case clientID:
		return ru, clientID, true, fmt.Errorf("%q: a clientid: rule is a connect or read rule: want <allow|deny> <connect|read> <who> clientid:<pattern>", access)
	case access == "read":
		ru.read = true
	case access == "write":
		ru.write = true
	case access == "readwrite":
		ru.read, ru.write = true, true
	default:
		return ru, clientID, true, fmt.Errorf("%q: want read, write or readwrite", access)
	}
	if ru.user, ru.client, err = parseWho(fields[2]); err != nil {
		return ru, clientID, true, err
	}
	if isGroup {
		ru.pattern = strings.TrimPrefix(object, groupObject)
	} else {
		ru.pattern = strings.TrimPrefix(object, clientIDObject)
	}
	switch {
	case ru.pattern == "":
		return ru, clientID, true, fmt.Errorf("%q: empty pattern", object)
	case strings.ContainsAny(ru.pattern, " \t"):
		return ru, clientID, true, fmt.Errorf("%q: a pattern holds no spaces", object)
	case isGroup && strings.ContainsAny(ru.pattern, "+#/"):
		return ru, clientID, true, fmt.Errorf("%q: a group name is one topic level, without + # or /", object)
	case clientID && strings.Contains(ru.pattern, "%c"):
		return ru, clientID, true, fmt.Errorf("%q: %%c has no place in a client-id rule", object)
	}
	return ru, clientID, true, nil
}

// appliesTo reports whether the rule's who names the client.
func (ru objRule) appliesTo(user, clientID string, anonymous bool) bool {
	switch {
	case ru.user != "" && (anonymous || ru.user != user):
		return false
	case ru.client != "" && ru.client != clientID:
		return false
	}
	return true
}

// matches reports whether name matches the rule's pattern for the client.
func (ru objRule) matches(name, user, clientID string, anonymous bool) bool {
	var segs []string // literal runs; between two, any text
	cur := strings.Builder{}
	p := ru.pattern
	for p != "" {
		var v string
		var isVar bool
		switch {
		case p[0] == '*':
			segs = append(segs, cur.String())
			cur.Reset()
			p = p[1:]
			continue
		case strings.HasPrefix(p, "%u"):
			v, isVar = user, true
			if anonymous {
				v = ""
			}
		case strings.HasPrefix(p, "%c"):
			v, isVar = clientID, true
		}
		if !isVar {
			cur.WriteByte(p[0])
			p = p[1:]
			continue
		}
		p = p[2:]
		if v != "" {
			cur.WriteString(v)
			continue
		}
		if ru.allow {
			return false // no name to stand in: an allow does not apply
		}
		segs = append(segs, cur.String()) // a deny matches any text there
		cur.Reset()
	}
	segs = append(segs, cur.String())
	return globMatch(segs, name)
}

// globMatch reports whether s is segs[0], any text, segs[1], ... any
// text, segs[n-1]: the first run is a prefix, the last a suffix, and the
// ones between are found leftmost, which finds a match if there is one.
// It takes time linear in len(s) times the number of runs.
func globMatch(segs []string, s string) bool {
	if len(segs) == 1 {
		return s == segs[0]
	}
	first, last := segs[0], segs[len(segs)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	mid := s[len(first) : len(s)-len(last)]
	for _, seg := range segs[1 : len(segs)-1] {
		i := strings.Index(mid, seg)
		if i < 0 {
			return false
		}
		mid = mid[i+len(seg):]
	}
	return true
}

// Identity names who the client is, the same for every connection of
// the same user (by password or certificate): "user:<name>", or
// "anonymous". A persistent session belongs to the identity that made it.
func (x *Access) Identity() string {
	if x.anonymous {
		return "anonymous"
	}
	return "user:" + x.user
}

// MayUseClientID reports whether the client may connect with its client
// id: always when the ACL has no client-id rules, else when the first
// that applies to the client and matches its id allows.
func (x *Access) MayUseClientID() bool {
	set := x.a.cur.Load()
	if set.acl == nil || len(set.acl.clientIDs) == 0 {
		return true
	}
	for _, ru := range set.acl.clientIDs {
		if ru.appliesTo(x.user, x.client, x.anonymous) && ru.matches(x.client, x.user, x.client, x.anonymous) {
			return ru.allow
		}
	}
	return false
}

// MayGroup reports whether the client may use consumer group: read its
// committed offsets (write false), or consume and commit (write true).
// Without an ACL every client may; with one, the first group rule for
// that access that applies to the client and matches the name decides,
// and no rule means no.
func (x *Access) MayGroup(group string, write bool) bool {
	set := x.a.cur.Load()
	if set.acl == nil {
		return true
	}
	for _, ru := range set.acl.groups {
		if (write && ru.write || !write && ru.read) && ru.appliesTo(x.user, x.client, x.anonymous) &&
			ru.matches(group, x.user, x.client, x.anonymous) {
			return ru.allow
		}
	}
	return false
}

// MayReadClientID reports whether the client may be shown id as the
// publisher of a record it reads (a $replay or $group subscription that
// asks for it). Without an ACL every client may; with one, the first
// clientid: read rule that applies to the client and matches id decides,
// and no rule means no: an ACL from before these rules shows nobody's.
func (x *Access) MayReadClientID(id string) bool {
	set := x.a.cur.Load()
	if set.acl == nil {
		return true
	}
	for _, ru := range set.acl.clientIDReads {
		if ru.appliesTo(x.user, x.client, x.anonymous) && ru.matches(id, x.user, x.client, x.anonymous) {
			return ru.allow
		}
	}
	return false
}
