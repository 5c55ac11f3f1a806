"""The reward service (`orchard.reward.v1`): outcome rewards, the RPR rubric judge and the OPD teacher."""
