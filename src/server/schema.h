/*
 * server/schema.h — a request's JSON Schema (response_format json_schema) compiled into the
 * node table of akv/json_schema.h that the engine's sampling follows.
 *
 * Taken: type (a name, or a name with "null"), properties with required (no other key may
 * appear: additionalProperties false, as OpenAI's strict mode asks), items with minItems and
 * maxItems, enum and const (any JSON values), anyOf / oneOf of a schema and {"type": "null"},
 * allOf of one schema, $ref to "#/$defs/..." or "#/definitions/..." (recursion allowed); an
 * object with no properties takes any object, a schema with no type any value. Not followed
 * (accepted, not enforced): numeric bounds, string lengths, pattern, format. Refused, naming
 * the keyword: additionalProperties true or a schema beside properties, other anyOf / oneOf /
 * allOf, not, if/then/else, patternProperties, more than 64 properties or enum values, a
 * property name with a quote or backslash or over 120 bytes, more than 1024 nodes.
 */
#ifndef AKV_SERVER_SCHEMA_H
#define AKV_SERVER_SCHEMA_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "akv/json_schema.h"
#include "akv/status.h"

typedef struct akv_srv_schema akv_srv_schema;

/* Compiles `schema`. AKV_OK and *out; AKV_EINVAL with why[cap] naming what is refused;
 * AKV_ENOMEM. */
akv_status akv_srv_schema_compile(const cJSON *schema, akv_srv_schema **out, char *why, size_t cap);

/* The compiled table (valid until akv_srv_schema_free). */
const akv_json_schema *akv_srv_schema_view(const akv_srv_schema *s);

void akv_srv_schema_free(akv_srv_schema *s); /* NULL is a no-op */

#endif
