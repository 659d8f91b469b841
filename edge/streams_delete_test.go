package edge

import (
	"net/http"
	"strings"
	"testing"
)

// In a site the node asked refuses a stream its own configuration lists,
// and a stream the controller does not know is 404: the request reaches
// the controller only for a stream that can be deleted.
func TestCluster_DeleteStreamRefusals(t *testing.T) {
	nodes := startSiteNodes(t, 1)
	base := "http://" + nodes[0].HTTPAddr().String() + "/api/v1/streams/"
	if code, _, body := get(t, http.MethodDelete, base+"default"); code != http.StatusConflict ||
		!strings.Contains(string(body), "remove it from streams:") {
		t.Fatalf("DELETE default: %d %s, want 409 saying to remove it from streams:", code, body)
	}
	if code, _, body := get(t, http.MethodDelete, base+"nope"); code != http.StatusNotFound ||
		!strings.Contains(string(body), "unknown stream") {
		t.Fatalf("DELETE nope: %d %s, want 404 from the controller", code, body)
	}
	if st := nodes[0].site.Load().Node.View().Streams["default"]; st == nil {
		t.Fatal("the refused deletion removed the stream from the state")
	}
}
