// Package yamlfield reads YAML documents field by field and reports every
// problem with its file, line and field, for the policy package and the
// simulator's scenario parser.
//
// A caller names its sentinel error with a zero-size type implementing
// Sentinel, so that its Error and Errors wrap its own sentinel:
//
//	type invalid struct{}
//	func (invalid) Sentinel() error { return ErrInvalid }
//
//	c := &yamlfield.Checker[invalid]{File: file}
//	if root := c.Root(data, yamlfield.Document{Empty: "document is empty"}); root != nil {
//		fs := c.Fields(root, "", "name", "limit")
//		...
//	}
//	return c.Err() // nil, or an Errors[invalid] sorted by line
//
// A Checker records a problem and moves on, so one pass reports them all.
package yamlfield
