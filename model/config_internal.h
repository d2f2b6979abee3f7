/* Private to model/: the parts of reading config.json that live in their own files. */
#ifndef SMELT_MODEL_CONFIG_INTERNAL_H
#define SMELT_MODEL_CONFIG_INTERNAL_H

#include "model/config.h"

/* rope_theta, partial_rotary_factor and rope_scaling / rope_parameters of a rope model's
 * config.json into c (rope_theta, rope_scaling); max_position_embeddings must be read
 * already. Errors name the field; where prefixes them. */
int model_config_parse_rope(const json_t *root, const char *where, struct model_config *c, struct smelt_error *err);

#endif
