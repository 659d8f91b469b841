package auth

import (
	"strings"
	"testing"
)

func TestACL_GroupAndClientIDRules(t *testing.T) {
	acl, err := ParseACL(strings.NewReader(`
deny  readwrite *          group:%u.private
allow readwrite *          group:%u.*
allow read      user:ops   group:*
allow readwrite client:gw1 group:gw-%c
allow connect   user:admin clientid:*
deny  connect   *          clientid:*-test
allow connect   *          clientid:%u-*
allow readwrite *          group:/literal
`))
	if err == nil || !strings.Contains(err.Error(), "line 9") {
		t.Fatalf("a group name with / parsed: %v", err)
	}
	acl, err = ParseACL(strings.NewReader(strings.Join([]string{
		"deny  readwrite *          group:%u.private",
		"allow readwrite *          group:%u.*",
		"allow read      user:ops   group:*",
		"allow readwrite client:gw1 group:gw-%c",
		"allow connect   user:admin clientid:*",
		"deny  connect   *          clientid:*-test",
		"allow connect   *          clientid:%u-*",
		"allow readwrite *          sensors/#",
	}, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	if acl.Rules() != 8 {
		t.Errorf("Rules() = %d, want 8", acl.Rules())
	}
	a := &Auth{}
	a.cur.Store(&ruleset{acl: acl})
	x := func(user, client string) *Access {
		return &Access{a: a, user: user, client: client, anonymous: user == ""}
	}
	groups := []struct {
		x     *Access
		group string
		write bool
		want  bool
	}{
		{x("alice", "c"), "alice.jobs", true, true},
		{x("alice", "c"), "alice.", true, true},
		{x("alice", "c"), "alice.private", false, false},
		{x("alice", "c"), "bob.jobs", false, false},
		{x("alice", "c"), "alicex.jobs", true, false},
		{x("a*", "c"), "abc.jobs", true, false}, // a user's name is literal
		{x("a*", "c"), "a*.jobs", true, true},
		{x("ops", "c"), "bob.jobs", false, true},
		{x("ops", "c"), "bob.jobs", true, false},
		{x("", "c"), ".jobs", true, false}, // anonymous: no %u
		{x("", "gw1"), "gw-gw1", true, true},
		{x("", "gw2"), "gw-gw2", true, false},
	}
	for _, tc := range groups {
		if got := tc.x.MayGroup(tc.group, tc.write); got != tc.want {
			t.Errorf("%q/%q MayGroup(%q, write %v) = %v, want %v", tc.x.user, tc.x.client, tc.group, tc.write, got, tc.want)
		}
	}
	ids := []struct {
		x    *Access
		want bool
	}{
		{x("admin", "anything"), true},
		{x("alice", "alice-1"), true},
		{x("alice", "alice-1-test"), false},
		{x("alice", "alice"), false},
		{x("alice", "bob-1"), false},
		{x("", "-1"), false},
	}
	for _, tc := range ids {
		if got := tc.x.MayUseClientID(); got != tc.want {
			t.Errorf("%q MayUseClientID(%q) = %v, want %v", tc.x.user, tc.x.client, got, tc.want)
		}
	}
	// A deny that needs a name the client lacks denies whatever stands there.
	deny, err := ParseACL(strings.NewReader("deny readwrite * group:%u.x\nallow readwrite * group:*\n"))
	if err != nil {
		t.Fatal(err)
	}
	a.cur.Store(&ruleset{acl: deny})
	if x("", "c").MayGroup("anyone.x", true) || !x("", "c").MayGroup("anyone.y", true) {
		t.Error("a deny with %u for an anonymous client does not deny every name there")
	}
	for _, bad := range []string{
		"allow connect * group:x",
		"allow readwrite * clientid:x",
		"allow write * clientid:x",
		"allow connect * clientid:%c-1",
		"allow read * clientid:%c-1",
		"allow readwrite * group:",
		"allow readwrite * group:a+b",
	} {
		if _, err := ParseACL(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed, want an error", bad)
		}
	}
}

func TestGlobMatch(t *testing.T) {
	for _, tc := range []struct {
		segs []string
		s    string
		want bool
	}{
		{[]string{"abc"}, "abc", true},
		{[]string{"abc"}, "abcd", false},
		{[]string{"a", ""}, "abc", true},
		{[]string{"", "c"}, "abc", true},
		{[]string{"ab", "bc"}, "abc", false}, // runs may not overlap
		{[]string{"a", "b", "c"}, "axbyc", true},
		{[]string{"a", "b", "c"}, "acb", false},
		{[]string{"", "", ""}, "", true},
	} {
		if got := globMatch(tc.segs, tc.s); got != tc.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tc.segs, tc.s, got, tc.want)
		}
	}
}

// Read rules on client ids say whose ids a subscriber that asks is shown
// as records' publishers; they do not turn on the connect rules, and an
// ACL without them shows nobody's.
func TestACL_ClientIDReadRules(t *testing.T) {
	text := strings.Join([]string{
		"deny  read      *            clientid:*-secret",
		"allow read      user:site-a  clientid:*",
		"allow read      *            clientid:%u-*",
		"allow readwrite *            #",
	}, "\n")
	if n := parseACL(t, text).Rules(); n != 4 {
		t.Errorf("Rules() = %d, want 4", n)
	}
	x := func(user, client string) *Access { return accessFor(t, text, user, client) }
	for _, tc := range []struct {
		x    *Access
		id   string
		want bool
	}{
		{x("site-a", "site-a-down"), "hq-sensor-1", true},
		{x("site-a", "site-a-down"), "hq-sensor-1-secret", false},
		{x("bob", "c"), "bob-7", true},
		{x("bob", "c"), "hq-sensor-1", false},
		{x("", "c"), "-7", false}, // anonymous: no %u
	} {
		if got := tc.x.MayReadClientID(tc.id); got != tc.want {
			t.Errorf("%q MayReadClientID(%q) = %v, want %v", tc.x.user, tc.id, got, tc.want)
		}
	}
	if !x("bob", "anything").MayUseClientID() {
		t.Error("read rules alone restrict the client ids one may connect with")
	}
	if accessFor(t, "allow readwrite * #\n", "site-a", "c").MayReadClientID("hq-sensor-1") {
		t.Error("an ACL without clientid read rules shows a publisher's id")
	}
	a := &Auth{}
	a.cur.Store(&ruleset{})
	if !(&Access{a: a, user: "site-a", client: "c"}).MayReadClientID("hq-sensor-1") {
		t.Error("without an ACL, a publisher's id is hidden")
	}
}
