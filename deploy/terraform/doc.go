// Package terraform holds no code: it is the home of the test that checks the
// Terraform module deploying regiond (modules/regiond) and its three-region
// example without a provider download. The test parses every file, resolves
// every reference between variables, locals, modules and outputs, checks the
// flags passed to regiond and cmd/agent against the flags those commands
// define, checks the Go duration pattern of the variables' validations, parses
// the example policy with ration's own parser, and runs terraform fmt -check
// when terraform is installed. See README.md.
package terraform
