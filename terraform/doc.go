// Package terraform holds no code: it is the home of the Terraform modules that provision an
// elasticd cluster per cloud (aws, gcp, azure, ibm), of the module they share for the job
// (modules/elasticd-job), and of the offline tests that check them.
package terraform
